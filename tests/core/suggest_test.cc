// Tests for the typo suggestions of core/suggest.h.
#include "core/suggest.h"

#include <catch2/catch.hpp>

using namespace kiln;

TEST_CASE("EditDistance counts edits, a swap of neighbours as one, case aside", "[suggest]") {
  CHECK(EditDistance("resize", "resize") == 0);
  CHECK(EditDistance("--resise", "--resize") == 1);  // substitution
  CHECK(EditDistance("biuld", "build") == 1);        // neighbours swapped
  CHECK(EditDistance("verfy", "verify") == 1);       // deletion
  CHECK(EditDistance("Inspect", "inspect") == 0);
  CHECK(EditDistance("", "abc") == 3);
  CHECK(EditDistance("kitten", "sitting") == 3);
}

TEST_CASE("ClosestNames: the nearest names, only when near", "[suggest]") {
  const std::vector<std::string> options = {"--resize", "--crop", "--size", "--help", "-h"};
  CHECK(ClosestNames("--resise", options) == std::vector<std::string>{"--resize"});
  CHECK(ClosestNames("--crp", options) == std::vector<std::string>{"--crop"});
  CHECK(ClosestNames("--frobnicate", options).empty());
  const std::vector<std::string> classes = {"cat", "car", "dog"};
  CHECK(ClosestNames("cas", classes) == std::vector<std::string>{"cat", "car"});
  CHECK(ClosestNames("x", {"y"}).empty());  // one letter of one: not a typo of it
  CHECK(DidYouMean("--resise", options) == "; did you mean --resize?");
  CHECK(DidYouMean("cas", classes) == "; did you mean cat or car?");
  CHECK(DidYouMean("zebra", classes).empty());
}
