// Integers read from kiln's JSON files (internal header): manifest.json,
// build.json, a checkpoint's state.json.
//
// nlohmann's get<int>() of 1e300 is undefined behaviour (a float converted
// to an integer type it does not fit), get<uint64_t>() of -1 wraps to
// 2^64 - 1 and get<int>() of 1.5 truncates to 1. Every JSON integer kiln
// reads goes through JsonInteger instead, which accepts exactly the JSON
// integers (no fraction, no exponent) inside the field's range.
#ifndef KILN_SRC_CORE_JSON_NUMBER_H_
#define KILN_SRC_CORE_JSON_NUMBER_H_

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "kiln/status.h"

namespace kiln {

// Reads `value`, the field `field` (as a person finds it: "count",
// "shards[2].first") of the file `where`, into *out. Returns Corruption
// naming `where`, `field`, the range and the value when `value` is not an
// integer in [lo, hi]: a float (1.5, 1e300), a string, null, ... *out is
// left alone then.
template <typename T>
Status JsonInteger(const nlohmann::json& value, const std::string& where, const std::string& field,
                   T* out, T lo = std::numeric_limits<T>::min(),
                   T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  // Every int64_t and uint64_t fits in __int128: one comparison for both.
  __int128 v = 0;
  bool integer = true;
  if (value.is_number_unsigned()) {
    v = value.get<uint64_t>();
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
  } else {
    integer = false;
  }
  if (!integer || v < lo || v > hi) {
    // Replacing bytes that are not UTF-8, where dump() would throw.
    std::string shown = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    return Status::Corruption(where + ": \"" + field + "\" must be an integer in " +
                              std::to_string(lo) + ".." + std::to_string(hi) + ", not " + shown);
  }
  *out = static_cast<T>(v);
  return Status::OK();
}

}  // namespace kiln

#endif  // KILN_SRC_CORE_JSON_NUMBER_H_
