// Small POSIX file helpers shared by the core (internal header).
#ifndef KILN_SRC_CORE_FILE_UTIL_H_
#define KILN_SRC_CORE_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln {

// Reads a whole file. NotFound when it does not exist, IOError otherwise.
Status ReadWholeFile(const std::string& path, std::string* out);
// Writes DIR/NAME atomically: DIR/TEMP is written and fsynced, renamed over
// NAME, and DIR is fsynced, so NAME is either the old or the new content.
Status WriteFileAtomic(const std::string& dir, const std::string& name, const std::string& temp,
                       const std::string& content);
// Size of a file in bytes; NotFound when absent.
Status FileSize(const std::string& path, uint64_t* size);
// Creates a directory and its parents (like mkdir -p).
Status MakeDirs(const std::string& path);
// "<path>: <strerror(err)>" as an IOError (NotFound for ENOENT).
Status PosixError(const std::string& context, int err);

}  // namespace kiln

#endif  // KILN_SRC_CORE_FILE_UTIL_H_
