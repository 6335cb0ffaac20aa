// sources.tsv (internal): every source file of a build with the record it
// became, -1 when rejected, in another split or in another part
// (docs/format.md). Written by kiln build, joined by kiln merge, read by
// verify --level sources/deep.
#ifndef KILN_SRC_BUILD_SOURCES_TSV_H_
#define KILN_SRC_BUILD_SOURCES_TSV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/ingest/build.h"
#include "kiln/status.h"

namespace kiln::ingest {

struct RecordedSource {
  int64_t record = -1;
  SourceItem item;
};

// A name as the manifest records it (escaped, core/escape.h) made raw
// again; `text` itself when it holds no valid escape.
std::string RawName(const std::string& text);

// NotFound when the file is absent; Corruption naming the line otherwise.
Status ReadSourcesTsv(const std::string& path, std::vector<RecordedSource>* out);
// Parses the text of a sources.tsv (`where` names it in messages), header
// line first, appending its rows to *out. Returns Corruption naming the
// line for one that has not five fields, a bad escape in the path, or a
// field that is not a decimal number in its range (record -1 or more, size
// 0 or more).
Status ParseSourcesTsv(const std::string& text, const std::string& where,
                       std::vector<RecordedSource>* out);
// The text of a sources.tsv, header line first, that ParseSourcesTsv reads.
std::string FormatSourcesTsv(const std::vector<RecordedSource>& sources);
// Writes FormatSourcesTsv's text to `path` (temp file, fsync, rename).
Status WriteSourcesTsv(const std::string& path, const std::vector<RecordedSource>& sources);

}  // namespace kiln::ingest

#endif  // KILN_SRC_BUILD_SOURCES_TSV_H_
