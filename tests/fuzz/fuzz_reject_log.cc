// libFuzzer target: rejects.partial, the reject log a resumed build reads.
// Input: the file's text. Every position ParseRejectLog accepts comes with
// its entry (path, reason, retry), each field free of tabs and line breaks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "journal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::set<size_t> positions;
  std::vector<kiln::ingest::RejectEntry> entries;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!kiln::ingest::ParseRejectLog(text, "rejects.partial", &positions, &entries).ok()) return 0;
  KILN_FUZZ_CHECK(positions.size() <= entries.size());
  for (const kiln::ingest::RejectEntry& e : entries) {
    KILN_FUZZ_CHECK(e.path.find('\n') == std::string::npos);
    KILN_FUZZ_CHECK(e.path.find('\t') == std::string::npos);
    KILN_FUZZ_CHECK(e.reason.find('\n') == std::string::npos);
    KILN_FUZZ_CHECK(e.reason.find('\t') == std::string::npos);
  }
  // What rejects.tsv makes of them reads back the same.
  const std::string tsv = kiln::ingest::RejectsTsv(entries);
  KILN_FUZZ_CHECK(static_cast<size_t>(std::count(tsv.begin(), tsv.end(), '\n')) ==
                  entries.size() + 1);
  return 0;
}
