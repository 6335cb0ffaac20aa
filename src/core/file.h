// Small POSIX file helpers of kiln, shared by every module.
#ifndef KILN_SRC_CORE_FILE_H_
#define KILN_SRC_CORE_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

// Reads a whole file. NotFound when it does not exist, IOError otherwise.
Status ReadWholeFile(const std::string& path, std::string* out);
// Reads a whole file into bytes, sized once from fstat (an input image).
// The message leaves out the path ("cannot open: <reason>", "cannot read:
// <reason>"): the caller names the file. IOError when the environment
// failed (IsTransientError: permission denied, an I/O error, no descriptor
// or memory left), NotFound when the file is gone, InvalidArgument for
// another cause in the file itself (a symbolic link loop, say, or a file
// that shrank while it was read).
Status ReadFileBytes(const std::string& path, std::vector<uint8_t>* out);
// Whether errno `err` says that the environment failed rather than the
// file: permission denied, an I/O error, too many open files, no memory, a
// busy, stale or unreachable device or network file system. Such a failure
// can pass without any change to the file, so what failed is worth trying
// again later.
bool IsTransientError(int err);
// Writes DIR/NAME atomically: DIR/TEMP is written and fsynced, renamed over
// NAME, and DIR is fsynced, so NAME is either the old or the new content.
Status WriteFileAtomic(const std::string& dir, const std::string& name, const std::string& temp,
                       const std::string& content);
// fsync(2) of a file or a directory (a directory: the names in it, after a
// rename), so that it survives a crash of the machine. IOError naming it.
Status SyncPath(const std::string& path);
// Size of a file in bytes; NotFound when absent.
Status FileSize(const std::string& path, uint64_t* size);
// Creates a directory and its parents (like mkdir -p).
Status MakeDirs(const std::string& path);
// For an errno that means the data did not fit - ENOSPC (the filesystem is
// full), EDQUOT (a quota), EFBIG (a file size limit) - what to do about it,
// starting with "; "; "" for any other.
std::string NoSpaceAdvice(int err);
// "<path>: <strerror(err)>" as an IOError (NotFound for ENOENT), with
// NoSpaceAdvice(err).
Status PosixError(const std::string& context, int err);

}  // namespace kiln

#endif  // KILN_SRC_CORE_FILE_H_
