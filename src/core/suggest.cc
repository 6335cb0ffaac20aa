#include "core/suggest.h"

#include <algorithm>
#include <cctype>

namespace kiln {

size_t EditDistance(const std::string& a, const std::string& b) {
  const auto lower = [](char c) { return std::tolower(static_cast<unsigned char>(c)); };
  // d[i][j]: distance between the first i characters of a and the first j of b.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::vector<std::string> ClosestNames(const std::string& word,
                                      const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  size_t best = limit + 1;
  std::vector<std::string> out;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d > limit || d >= word.size() || d > best) continue;
    if (d < best) out.clear();
    best = d;
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::string DidYouMean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::vector<std::string> near = ClosestNames(word, candidates);
  if (near.empty()) return "";
  std::string s = "; did you mean ";
  for (size_t i = 0; i < near.size(); ++i) {
    if (i > 0) s += i + 1 == near.size() ? " or " : ", ";
    s += near[i];
  }
  return s + "?";
}

}  // namespace kiln
