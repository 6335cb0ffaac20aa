// libFuzzer target: ParseByteSize, the rule of every size option
// (--shard-size, --memory-budget). Input: the option's text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "core/units.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  uint64_t bytes = 0;
  const kiln::Status s = kiln::ParseByteSize(text, "--size", &bytes);
  if (s.ok()) {
    KILN_FUZZ_CHECK(bytes >= 1);
  } else {
    KILN_FUZZ_CHECK(s.IsInvalidArgument());
    KILN_FUZZ_CHECK(s.message().find("--size") != std::string::npos);
  }
  (void)kiln::FormatByteSize(static_cast<double>(bytes));
  return 0;
}
