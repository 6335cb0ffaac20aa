// libFuzzer target: a cache's sources.tsv (read by verify --level sources,
// merge, repair and the duplicate report).
// Input: the file's text. What ParseSourcesTsv accepts, written again by
// FormatSourcesTsv, must read back to the same rows.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "sources_tsv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kiln::ingest::RecordedSource;
  std::vector<RecordedSource> rows;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!kiln::ingest::ParseSourcesTsv(text, "sources.tsv", &rows).ok()) return 0;
  std::vector<RecordedSource> again;
  KILN_FUZZ_CHECK(
      kiln::ingest::ParseSourcesTsv(kiln::ingest::FormatSourcesTsv(rows), "again", &again).ok());
  KILN_FUZZ_CHECK(again.size() == rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    KILN_FUZZ_CHECK(rows[i].record >= -1);
    KILN_FUZZ_CHECK(again[i].record == rows[i].record);
    KILN_FUZZ_CHECK(again[i].item.rel_path == rows[i].item.rel_path);
    KILN_FUZZ_CHECK(again[i].item.label == rows[i].item.label);
    KILN_FUZZ_CHECK(again[i].item.size == rows[i].item.size);
    KILN_FUZZ_CHECK(again[i].item.mtime_ns == rows[i].item.mtime_ns);
  }
  return 0;
}
