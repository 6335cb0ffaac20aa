#include "core/escape.h"

#include <catch2/catch.hpp>
#include <string>

using namespace kiln;

TEST_CASE("EscapeName keeps ordinary names and UTF-8, escapes what would break a line",
          "[escape]") {
  CHECK(EscapeName("cats/0001.jpg") == "cats/0001.jpg");
  CHECK(EscapeName("caf\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac.png") == "caf\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac.png");
  CHECK(EscapeName("emoji \xf0\x9f\x90\x88.png") == "emoji \xf0\x9f\x90\x88.png");
  CHECK(EscapeName("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e");
  CHECK(EscapeName(std::string("nul\0x", 5)) == "nul\\x00x");
  CHECK(EscapeName("del\x7f") == "del\\x7f");
  // Not UTF-8: Latin-1 e-acute, a lone continuation byte, a truncated
  // sequence, an overlong '/', a surrogate, above U+10FFFF.
  CHECK(EscapeName("caf\xe9.png") == "caf\\xe9.png");
  CHECK(EscapeName("\x80") == "\\x80");
  CHECK(EscapeName("\xe6\x97") == "\\xe6\\x97");
  CHECK(EscapeName("\xc0\xaf") == "\\xc0\\xaf");
  CHECK(EscapeName("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  CHECK(EscapeName("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");
}

TEST_CASE("UnescapeName inverts EscapeName for every byte and refuses broken escapes",
          "[escape]") {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  all += "\xc3\xa9\\x41\\";
  const std::string text = EscapeName(all);
  CHECK(text.find_first_of("\t\n\r") == std::string::npos);
  std::string back;
  REQUIRE(UnescapeName(text, &back));
  CHECK(back == all);
  CHECK(UnescapeName("plain", &back));
  CHECK(back == "plain");
  CHECK_FALSE(UnescapeName("ends with \\", &back));
  CHECK_FALSE(UnescapeName("\\q", &back));
  CHECK_FALSE(UnescapeName("\\x4", &back));
  CHECK_FALSE(UnescapeName("\\xg0", &back));
}
