// Reading kiln's JSON files (internal header): manifest.json, build.json,
// a checkpoint's state.json - text that may be damaged or hostile.
//
// nlohmann's parser builds any depth of nesting without recursion, but
// dump(), comparisons and copies recurse: ParseJson refuses text nested
// deeper than kMaxJsonDepth, which no file kiln writes comes near.
//
// nlohmann's get<int>() of 1e300 is undefined behaviour (a float converted
// to an integer type it does not fit), get<uint64_t>() of -1 wraps to
// 2^64 - 1 and get<int>() of 1.5 truncates to 1. Every JSON integer kiln
// reads goes through JsonInteger instead, which accepts exactly the JSON
// integers (no fraction, no exponent) inside the field's range.
#ifndef KILN_SRC_CORE_JSON_READ_H_
#define KILN_SRC_CORE_JSON_READ_H_

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "kiln/status.h"

namespace kiln {

// Arrays and objects inside one another (the top-level value is depth 0).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`, the file `where`, into *out. Returns Corruption naming
// `where` for text that is not JSON or is nested deeper than kMaxJsonDepth.
inline Status ParseJson(const std::string& text, const std::string& where, nlohmann::json* out) {
  bool too_deep = false;
  // Called for every value and key with its depth; false discards what is
  // being built, so nothing deeper than the limit is kept.
  auto depth_limit = [&too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;
  };
  nlohmann::json j = nlohmann::json::parse(text, depth_limit, /*allow_exceptions=*/false);
  if (too_deep)
    return Status::Corruption(where + ": JSON nested more than " + std::to_string(kMaxJsonDepth) +
                              " levels deep");
  if (j.is_discarded()) return Status::Corruption(where + ": not valid JSON");
  *out = std::move(j);
  return Status::OK();
}

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

#endif  // KILN_SRC_CORE_JSON_READ_H_
