// Visible skips for kiln's Catch2 tests, defined with main() in
// catch_main.cc.
#ifndef KILN_TESTS_TEST_SKIP_H_
#define KILN_TESTS_TEST_SKIP_H_

#include <string>

namespace kiln::testing {

// Skipping a test visibly (Catch2 v2 has no SKIP): a test that cannot run
// here calls Skip and returns. "SKIPPED: reason" is printed, the test case
// is listed as skipped, and a process whose every test case skipped exits
// with kSkipExitCode, which CTest reports as "Skipped" (SKIP_RETURN_CODE).
enum class SkipWhy {
  // A part of kiln or a package this build or machine lacks (kiln build,
  // Gloo, PIL). tools/setup.sh test installs them all and sets
  // KILN_TESTS_MUST_RUN=1, under which such a skip fails the test: in CI a
  // skip of this kind is a broken build, not a missing package.
  kNotBuilt,
  // Something the host may not allow even with everything installed (a
  // read-only bind mount without the privilege): a skip, even in CI.
  kHostCannot,
  // A GPU this machine lacks: the [cuda] cases, compiled in every build and
  // run by CTest everywhere, skip (visibly, even in CI) where CUDA finds no
  // device, and run on a GPU machine (tools/gpu_check.sh).
  kNoDevice,
};
constexpr int kSkipExitCode = 77;
void Skip(SkipWhy why, const std::string& reason);

}  // namespace kiln::testing

#endif  // KILN_TESTS_TEST_SKIP_H_
