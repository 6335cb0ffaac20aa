// libFuzzer target: the names in kiln's text files (core/escape.h).
// Input: any bytes, as a name and as escaped text. EscapeName must give one
// line of text without tabs or control bytes that UnescapeName turns back
// into the name; UnescapeName must refuse or decode any text without
// reading past it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "core/escape.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string escaped = kiln::EscapeName(bytes);
  for (const char c : escaped) {
    const auto u = static_cast<unsigned char>(c);
    KILN_FUZZ_CHECK(u >= 0x20 && u != 0x7f);
  }
  std::string name;
  KILN_FUZZ_CHECK(kiln::UnescapeName(escaped, &name));
  KILN_FUZZ_CHECK(name == bytes);
  // Escaping is idempotent on its own output's name: one canonical form.
  KILN_FUZZ_CHECK(kiln::EscapeName(name) == escaped);
  std::string decoded;
  if (kiln::UnescapeName(bytes, &decoded)) {
    KILN_FUZZ_CHECK(decoded.size() <= bytes.size());
    std::string back;
    KILN_FUZZ_CHECK(kiln::UnescapeName(kiln::EscapeName(decoded), &back) && back == decoded);
  }
  return 0;
}
