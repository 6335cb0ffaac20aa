// Byte sizes on the command line, one rule for every option that takes one
// (kiln build --shard-size, kiln train --memory-budget):
//   a number (fractions allowed) with an optional unit;
//   K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024 ("4G" = 4 x 2^30);
//   KB, MB, GB, TB are powers of 1000, as SI says ("4GB" = 4 x 10^9);
//   B or no unit: bytes. Units are case-sensitive except the single letters.
#ifndef KILN_SRC_CORE_UNITS_H_
#define KILN_SRC_CORE_UNITS_H_

#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln {

// Parses `text` by the rule above. InvalidArgument naming `option` and the
// rule for text that is not a positive size (or overflows 64 bits).
Status ParseByteSize(const std::string& text, const std::string& option, uint64_t* out);

// Formats a byte count for people, in powers of 1000 as the rule's KB .. TB:
// "512 B", "12.3 MB".
std::string FormatByteSize(double bytes);

// Formats a duration for people, with two or three significant digits and
// whole units beyond a minute: "0.4 ms", "24 ms", "1.23 s", "12.3 s",
// "2 min 05 s", "3 h 07 min". A negative or NaN duration reads as 0.
std::string FormatDuration(double seconds);

// A rate of bytes per second for people, "19.7 MB/s" (FormatByteSize);
// "" when `seconds` is not positive.
std::string FormatByteRate(double bytes, double seconds);

// The time now in UTC, ISO 8601 to the second ("2026-12-07T02:14:09Z"): an
// appends entry's "time" (kiln/manifest.h's AppendEntry).
std::string UtcNowIso8601();

}  // namespace kiln

#endif  // KILN_SRC_CORE_UNITS_H_
