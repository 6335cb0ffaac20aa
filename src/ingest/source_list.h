// The list-file parser behind ReadSourceList (internal), apart from the
// file system so that tests and the fuzzer reach it with any text.
#ifndef KILN_SRC_INGEST_SOURCE_LIST_H_
#define KILN_SRC_INGEST_SOURCE_LIST_H_

#include <functional>
#include <istream>
#include <string>

#include "kiln/ingest/build.h"
#include "kiln/status.h"

namespace kiln::ingest {

// Parses the lines of a list file or CSV (by `list_path`'s extension, which
// also names the lines in messages) read from `in`, as ReadSourceList
// describes, with sources below `root` (an absolute path, taken as given).
// `stat` fills in a listed item's size and mtime, or says why it cannot:
// the line goes to out->rejected, to be retried by the next build when the
// Status is an IOError (journal.h, Retryable).
Status ParseSourceList(std::istream& in, const std::string& list_path, const std::string& root,
                       const std::function<Status(SourceItem*)>& stat, SourceList* out);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_SOURCE_LIST_H_
