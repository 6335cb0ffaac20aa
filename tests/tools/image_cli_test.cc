// kiln export and kiln preview on the command line, and the suggestion for
// a mistyped kiln build option: exit codes and messages. The pictures
// themselves are checked through the library (tests/image/render_test.cc).
#include <catch2/catch.hpp>
#include <filesystem>

#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
int Kiln(const std::string& args, std::string* out) {
  return RunCommand(std::string(KILN_BIN) + " " + args, out);
}
}  // namespace

TEST_CASE("kiln export: a record as a PNG, index and output errors exit 2", "[cli]") {
  TempDir dir;
  WriteTestCache(dir / "c", 12, DType::kUint8, MakeShape({3, 8, 8}));
  std::string out;
  REQUIRE(Kiln("export " + (dir / "c") + " --index 11 -o " + (dir / "r.png"), &out) == 0);
  CHECK(std::filesystem::file_size(dir / "r.png") > 0);
  CHECK(Kiln("export " + (dir / "c") + " --index 12 -o " + (dir / "r.png"), &out) == 2);
  CHECK_THAT(out, Catch::Contains("index 12 is out of range") &&
                      Catch::Contains("holds 12 records (0..11)"));
  CHECK(Kiln("export " + (dir / "c") + " --index 0 -o " + (dir / "nodir/r.png"), &out) == 2);
  CHECK_THAT(out, Catch::Contains("cannot write " + (dir / "nodir/r.png")));
}

TEST_CASE("kiln export and preview read the split --split names", "[cli]") {
  TempDir dir;
  WriteTestCache(dir / "train", 12, DType::kUint8, MakeShape({1, 8, 8}));
  WriteTestCache(dir / "val", 3, DType::kUint8, MakeShape({1, 8, 8}));
  std::string out;
  CHECK(Kiln("export " + dir.path() + " --index 5 -o " + (dir / "t.png"), &out) == 0);
  CHECK_THAT(out, Catch::Contains(dir / "train"));
  CHECK(Kiln("export " + dir.path() + " --split val --index 5 -o " + (dir / "v.png"), &out) == 2);
  CHECK_THAT(out, Catch::Contains("holds 3 records"));
  CHECK(Kiln("preview " + dir.path() + " --split val -o " + (dir / "v.png"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("3 records of " + (dir / "val")));
  CHECK(Kiln("preview " + dir.path() + " --split test -o " + (dir / "v.png"), &out) == 2);
  CHECK_THAT(out, Catch::Contains("--split test"));
  CHECK(Kiln("preview " + (dir / "val") + " --split val -o " + (dir / "v.png"), &out) == 2);
}

TEST_CASE("kiln preview: an unknown class lists the classes", "[cli]") {
  TempDir dir;
  WriteTestCache(dir / "c", 20, DType::kUint8, MakeShape({1, 28, 28}), 4);
  std::string out;
  REQUIRE(
      Kiln("preview " + (dir / "c") + " --count 6 --classes class1,class3 -o " + (dir / "g.png"),
           &out) == 0);
  CHECK_THAT(out, Catch::Contains("kiln preview: 6 records"));
  CHECK(Kiln("preview " + (dir / "c") + " --classes class1,clas3 -o " + (dir / "g.png"), &out) ==
        2);
  CHECK_THAT(out, Catch::Contains("no class 'clas3'") &&
                      Catch::Contains("class0, class1, class2, class3"));
}

TEST_CASE("kiln build --resise: did you mean --resize?", "[cli]") {
  TempDir dir;
  std::string out;
  CHECK(Kiln("build --resise 32", &out) == 2);
  CHECK_THAT(out, Catch::Contains("kiln build: unknown option --resise; did you mean --resize?"));
  CHECK(Kiln("biuld " + dir.path() + " " + (dir / "out") + " --resize 32", &out) == 2);
  CHECK_THAT(out, Catch::Contains("unknown subcommand 'biuld'; did you mean build?"));
}
