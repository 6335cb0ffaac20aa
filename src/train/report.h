// Number formatting for kiln train's log lines (no LibTorch).
#ifndef KILN_SRC_TRAIN_REPORT_H_
#define KILN_SRC_TRAIN_REPORT_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace kiln::train::internal {

// Seconds from `since` to now.
double Seconds(std::chrono::steady_clock::time_point since);
// 1234567 -> "1,234,567".
std::string Thousands(int64_t v);
// `v` with `digits` digits after the point.
std::string Fixed(double v, int digits);

}  // namespace kiln::train::internal

#endif  // KILN_SRC_TRAIN_REPORT_H_
