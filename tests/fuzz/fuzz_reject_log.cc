// libFuzzer target: rejects.partial, the reject log a resumed build reads.
// Input: the file's text. Every position ParseRejectLog accepts comes with
// its "path<TAB>reason" line.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "journal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::set<size_t> positions;
  std::vector<std::string> lines;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!kiln::ingest::ParseRejectLog(text, "rejects.partial", &positions, &lines).ok()) return 0;
  KILN_FUZZ_CHECK(positions.size() <= lines.size());
  for (const std::string& line : lines) {
    KILN_FUZZ_CHECK(line.find('\n') == std::string::npos);
    (void)kiln::ingest::RejectText(line);
  }
  return 0;
}
