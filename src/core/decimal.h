// Decimal integers in kiln's text files (internal header): sources.tsv,
// rejects.partial, list files' labels.
//
// std::stoll and std::stoull throw, skip leading blanks, take "12abc" as 12
// and stoull takes "-1" as 2^64 - 1. ParseDecimal takes exactly what kiln
// writes with std::to_string.
#ifndef KILN_SRC_CORE_DECIMAL_H_
#define KILN_SRC_CORE_DECIMAL_H_

#include <charconv>
#include <string_view>
#include <system_error>

namespace kiln {

// Parses all of `text` as a decimal integer of type T: digits, after a '-'
// for a signed T; no blanks, no '+', nothing after the digits. Returns false
// (and leaves *out alone) for anything else or a value outside T's range.
template <typename T>
bool ParseDecimal(std::string_view text, T* out) {
  const char* end = text.data() + text.size();
  T value{};
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || stop != end) return false;
  *out = value;
  return true;
}

}  // namespace kiln

#endif  // KILN_SRC_CORE_DECIMAL_H_
