// Hidden test cases ([.]) that skip, for tests/skip_check.cmake: CTest
// runs them on their own and checks what a skip reports (catch_main.cc).
#include <catch2/catch.hpp>

#include "test_util.h"

using namespace kiln::testing;

TEST_CASE("a test whose part of kiln is not built", "[.][skip-demo][not-built]") {
  Skip(SkipWhy::kNotBuilt, "the demonstration of a skip");
}

TEST_CASE("a test that the host cannot run", "[.][skip-demo][host]") {
  Skip(SkipWhy::kHostCannot, "the demonstration of a host's skip");
}

TEST_CASE("a test that runs", "[.][skip-demo][runs]") { CHECK(1 + 1 == 2); }
