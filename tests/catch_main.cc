// One main() for every test executable, and the skipped-test report behind
// kiln::testing::Skip (test_util.h): Catch2 v2 has no SKIP.
//
// A test case that called Skip is listed as skipped when the run ends, and
// a run in which every test case that ran skipped exits with kSkipExitCode,
// which CTest reports as "Skipped" (catch_discover_tests runs one test case
// per process and sets SKIP_RETURN_CODE to it). A run of several cases in
// which some skipped exits as Catch2 would, with the list printed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "test_skip.h"

namespace {

struct SkipLog {
  bool current = false;  // the running test case called Skip
  int cases = 0;         // test cases that ran
  std::vector<std::string> skipped;
};

SkipLog& Log() {
  static SkipLog log;
  return log;
}

class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    Log().current = false;
    ++Log().cases;
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (Log().current) Log().skipped.push_back(stats.testInfo.name);
    TestEventListenerBase::testCaseEnded(stats);
  }
};
CATCH_REGISTER_LISTENER(SkipListener)

}  // namespace

namespace kiln::testing {

void Skip(SkipWhy why, const std::string& reason) {
  const char* must = std::getenv("KILN_TESTS_MUST_RUN");
  if (why == SkipWhy::kNotBuilt && must != nullptr && std::string(must) == "1")
    FAIL("this test must run here (KILN_TESTS_MUST_RUN=1) but would skip: " << reason);
  WARN("SKIPPED: " << reason);
  Log().current = true;
}

}  // namespace kiln::testing

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  const SkipLog& log = Log();
  if (log.skipped.empty()) return failed;
  std::cout << "SKIPPED " << log.skipped.size() << " of " << log.cases << " test cases:\n";
  for (const std::string& name : log.skipped) std::cout << "  " << name << "\n";
  if (failed == 0 && static_cast<int>(log.skipped.size()) == log.cases)
    return kiln::testing::kSkipExitCode;
  return failed;
}
