// Suggestions for a mistyped name: "unknown option --resise; did you mean
// --resize?". The command line uses them for options and subcommands,
// kiln preview for class names.
//
// Thread-safety: pure functions; call them from any thread.
#ifndef KILN_SRC_CORE_SUGGEST_H_
#define KILN_SRC_CORE_SUGGEST_H_

#include <string>
#include <vector>

namespace kiln {

// The edit distance between `a` and `b`, ignoring ASCII case: the fewest
// insertions, deletions, substitutions and swaps of two neighbouring
// characters that turn one into the other (optimal string alignment).
size_t EditDistance(const std::string& a, const std::string& b);

// The candidates nearest to `word` that are near enough to be what was
// meant: at distance at most max(1, word.size() / 3), and less than the
// length of `word`. All candidates at the smallest such distance, in the
// order given; empty when none is near.
std::vector<std::string> ClosestNames(const std::string& word,
                                      const std::vector<std::string>& candidates);

// "; did you mean X?" or "; did you mean X or Y?" for ClosestNames(word,
// candidates), "" when nothing is near: ready to append to an error message.
std::string DidYouMean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace kiln

#endif  // KILN_SRC_CORE_SUGGEST_H_
