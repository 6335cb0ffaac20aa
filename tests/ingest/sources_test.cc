// The source lists: ImageFolder (torchvision's class order), list files and
// CSV, their error messages, the source digest and sources.tsv.
#include <catch2/catch.hpp>
#include <filesystem>

#include "kiln/ingest/build.h"
#include "sources_tsv.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {
const std::string kPhotos = std::string(KILN_SAMPLE_DATA) + "/photos";
}  // namespace

TEST_CASE("ImageFolder labels follow torchvision's sorted class order", "[sources]") {
  TempDir dir;
  for (const char* c : {"b", "a", "C", "a_2"}) {
    fs::create_directories(dir / c);
    fs::copy_file(kPhotos + "/chelsea.jpg", dir / (std::string(c) + "/x.jpg"));
  }
  ingest::SourceList list;
  REQUIRE(ingest::ListImageFolder(dir.path(), &list).ok());
  // Python's sorted(): code-point order, upper case first.
  CHECK(list.classes == std::vector<std::string>{"C", "a", "a_2", "b"});
  REQUIRE(list.items.size() == 4);
  CHECK(list.items[0].rel_path == "C/x.jpg");
  CHECK(list.items[0].label == 0);
  CHECK(list.items[3].label == 3);
}

TEST_CASE("a symbolic link in an ImageFolder keeps its own path and class", "[sources]") {
  TempDir src;
  fs::create_directories(src / "a");
  fs::create_directories(src / "b");
  fs::copy_file(kPhotos + "/chelsea.jpg", src / "b/real.jpg");
  fs::create_symlink("../b/real.jpg", src / "a/link.jpg");
  ingest::SourceList list;
  REQUIRE(ingest::ListImageFolder(src.path(), &list).ok());
  REQUIRE(list.items.size() == 2);
  CHECK(list.items[0].rel_path == "a/link.jpg");
  CHECK(list.items[0].label == 0);
  CHECK(list.items[1].rel_path == "b/real.jpg");
  CHECK(list.items[1].label == 1);
}

TEST_CASE("symbolic link loops and links to nowhere are skipped and reported", "[sources]") {
  TempDir src;
  fs::create_directories(src / "a/sub");
  fs::create_directories(src / "b");
  fs::copy_file(kPhotos + "/chelsea.jpg", src / "a/1.jpg");
  fs::copy_file(kPhotos + "/coffee.jpg", src / "b/2.jpg");
  fs::create_directory_symlink("..", src / "a/loop");     // to SRC
  fs::create_directory_symlink(".", src / "a/sub/self");  // to the folder it lies in
  fs::create_symlink("l2.jpg", src / "b/l1.jpg");         // two links to each other
  fs::create_symlink("l1.jpg", src / "b/l2.jpg");
  fs::create_symlink("missing.jpg", src / "b/nowhere.jpg");  // to nothing
  fs::create_directory_symlink(".", src / "c");              // a "class" that is SRC again
  ingest::SourceList list;
  REQUIRE(ingest::ListImageFolder(src.path(), &list).ok());
  CHECK(list.classes == std::vector<std::string>{"a", "b"});
  REQUIRE(list.items.size() == 2);
  CHECK(list.items[0].rel_path == "a/1.jpg");
  CHECK(list.items[1].rel_path == "b/2.jpg");
  std::vector<std::string> rejected;
  for (const ingest::SourceReject& r : list.rejected) {
    CHECK_FALSE(r.retry);  // the tree's own shape: no retry mends it
    rejected.push_back(r.path.substr(list.root.size() + 1) + ": " + r.reason);
  }
  CHECK(rejected ==
        std::vector<std::string>{
            "a/loop: a symbolic link loop: it leads back to the source root; not followed",
            "a/sub/self: a symbolic link loop: it leads back to " + list.root +
                "/a/sub; not followed",
            "b/l1.jpg: a symbolic link loop (Too many levels of symbolic links); not followed",
            "b/l2.jpg: a symbolic link loop (Too many levels of symbolic links); not followed",
            "b/nowhere.jpg: a symbolic link to a file that does not exist",
            "c: a symbolic link loop: it leads back to the source root; not a class"});
  // The folder `skip` (a cache being built inside SRC) is not listed.
  fs::copy_file(kPhotos + "/camera.jpg", src / "a/sub/3.jpg");
  REQUIRE(ingest::ListImageFolder(src.path(), &list, src / "a/sub").ok());
  CHECK(list.items.size() == 2);
  REQUIRE(ingest::ListImageFolder(src.path(), &list).ok());
  CHECK(list.items.size() == 3);
}

TEST_CASE("an empty class folder is an error naming it", "[sources]") {
  TempDir dir;
  fs::create_directories(dir / "full");
  fs::create_directories(dir / "empty");
  fs::copy_file(kPhotos + "/chelsea.jpg", dir / "full/x.jpg");
  ingest::SourceList list;
  Status s = ingest::ListImageFolder(dir.path(), &list);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("empty"));
}

TEST_CASE("list files and CSV", "[sources]") {
  TempDir out;
  const std::string root = KILN_SAMPLE_DATA;
  SECTION("CSV with class names") {
    WriteFile(out / "l.csv", "path,label\nphotos/rocket.jpg,space\nphotos/chelsea.jpg,cat\n");
    ingest::SourceList list;
    REQUIRE(ingest::ReadSourceList(root, out / "l.csv", &list).ok());
    CHECK(list.classes == std::vector<std::string>{"cat", "space"});
    CHECK(list.items[1].label == 1);
  }
  SECTION("numeric labels are indices, not names: 10 is not before 2; -1 is an error") {
    WriteFile(out / "n.txt", "photos/chelsea.jpg 10\nphotos/coffee.jpg 2\n");
    ingest::SourceList list;
    REQUIRE(ingest::ReadSourceList(root, out / "n.txt", &list).ok());
    CHECK(list.items[0].label == 10);
    CHECK(list.items[1].label == 2);
    CHECK(list.classes.size() == 11);
    // A bad index rejects its line; a file with no usable line is refused.
    WriteFile(out / "neg.txt", "photos/chelsea.jpg 1\nphotos/coffee.jpg -1\n");
    ingest::SourceList neg;
    REQUIRE(ingest::ReadSourceList(root, out / "neg.txt", &neg).ok());
    CHECK(neg.items.size() == 1);
    REQUIRE(neg.rejected.size() == 1);
    CHECK(neg.rejected[0].path == neg.root + "/photos/coffee.jpg");
    CHECK_THAT(neg.rejected[0].reason, Catch::Contains("neg.txt:2") && Catch::Contains("label -1"));
    WriteFile(out / "big.txt", "photos/chelsea.jpg 99999999999999999999\n");
    Status s = ingest::ReadSourceList(root, out / "big.txt", &list);
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains("big.txt: lists no usable files") &&
                                Catch::Contains("big.txt:1") && Catch::Contains("class indices"));
    WriteFile(out / "many.txt", "photos/chelsea.jpg 300000000\n");
    CHECK(ingest::ReadSourceList(root, out / "many.txt", &list).IsInvalidArgument());
  }
  SECTION("CSV as Python's csv module writes it: BOM, comment, quoted path") {
    fs::create_directories(out / "root/a,b");
    fs::copy_file(kPhotos + "/chelsea.jpg", out / "root/a,b/c.jpg");
    WriteFile(out / "q.csv", "\xEF\xBB\xBF# made by hand\npath,label\r\n\"a,b/c.jpg\",cat\r\n");
    ingest::SourceList list;
    Status s = ingest::ReadSourceList(out / "root", out / "q.csv", &list);
    INFO(s.ToString());
    REQUIRE(s.ok());
    REQUIRE(list.items.size() == 1);
    CHECK(list.items[0].rel_path == "a,b/c.jpg");
  }
  SECTION("any name a filesystem allows is listed as it is (sources.tsv escapes it)") {
    fs::create_directories(out / "img/caf\xe9");
    fs::copy_file(kPhotos + "/chelsea.jpg", out / "img/caf\xe9/c\td\ne.jpg");
    ingest::SourceList list;
    REQUIRE(ingest::ListImageFolder(out / "img", &list).ok());
    CHECK(list.classes == std::vector<std::string>{"caf\xe9"});
    REQUIRE(list.items.size() == 1);
    CHECK(list.items[0].rel_path == "caf\xe9/c\td\ne.jpg");
  }
  SECTION("a bad line is rejected, naming the line; the good lines are listed") {
    WriteFile(out / "bad.txt",
              "photos/chelsea.jpg 1\nnolabel\n../etc/passwd 1\nphotos/gone.jpg 0\nphotos/coffee.jpg 0\n");
    ingest::SourceList list;
    REQUIRE(ingest::ReadSourceList(root, out / "bad.txt", &list).ok());
    REQUIRE(list.items.size() == 2);
    REQUIRE(list.rejected.size() == 3);
    CHECK(list.rejected[0].path == "nolabel");
    CHECK(list.rejected[0].reason == out / "bad.txt:2: expected \"relative/path label\"");
    CHECK(list.rejected[1].path == "../etc/passwd");
    CHECK_THAT(list.rejected[1].reason,
               Catch::StartsWith(out / "bad.txt:3: the path is outside the source root"));
    CHECK(list.rejected[2].path == list.root + "/photos/gone.jpg");
    CHECK(list.rejected[2].reason == out / "bad.txt:4: listed but not found");
    WriteFile(out / "h.csv", "path;label\n");
    Status s = ingest::ReadSourceList(root, out / "h.csv", &list);
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains("h.csv:1: CSV header"));
  }
}

TEST_CASE("a CSV of several labels and float targets", "[sources]") {
  TempDir out;
  const std::string root = KILN_SAMPLE_DATA;
  WriteFile(out / "m.csv",
            "path,labels,age,score\n"
            "photos/rocket.jpg,space;sky;space,3,0.5\n"
            "photos/chelsea.jpg,,7,-1e3\n"
            "photos/coffee.jpg,cat,x,1\n"
            "photos/camera.jpg,cat;sky,1\n"
            "photos/astronaut.jpg,sky,2,inf\n");
  ingest::SourceList list;
  REQUIRE(ingest::ReadSourceList(root, out / "m.csv", &list).ok());
  CHECK(list.multi_label);
  CHECK(list.target_names == std::vector<std::string>{"age", "score"});
  // Names over the labels of the lines that parse (cat is only on rejected
  // lines), sorted; each item's labels sorted, once.
  CHECK(list.classes == std::vector<std::string>{"sky", "space"});
  REQUIRE(list.items.size() == 2);  // sorted by path: chelsea, rocket
  CHECK(list.items[0].rel_path == "photos/chelsea.jpg");
  CHECK(list.items[0].labels.empty());
  CHECK(list.items[0].label == -1);
  CHECK(list.items[0].targets == std::vector<float>{7.0f, -1000.0f});
  CHECK(list.items[1].labels == std::vector<int64_t>{0, 1});
  CHECK(list.items[1].targets == std::vector<float>{3.0f, 0.5f});
  // A target that is not a finite number, and a line short of a column.
  REQUIRE(list.rejected.size() == 3);
  CHECK_THAT(list.rejected[0].reason,
             Catch::EndsWith("m.csv:4: expected \"path,labels,<2 numbers>\""));
  CHECK_THAT(list.rejected[1].reason, Catch::Contains("m.csv:5:"));
  CHECK_THAT(list.rejected[2].reason, Catch::Contains("m.csv:6:"));
  // The digest follows the labels and the targets.
  const std::string digest = ingest::SourceDigest(list);
  list.items[1].labels = {0};
  CHECK(ingest::SourceDigest(list) != digest);
  WriteFile(out / "bad.csv", "path,labels,\n");
  CHECK_THAT(ingest::ReadSourceList(root, out / "bad.csv", &list).message(),
             Catch::Contains("bad.csv:1: CSV header must be"));
}

TEST_CASE("ListSources picks the layout, and the digest follows path, label, size and mtime",
          "[sources]") {
  TempDir dir;
  fs::create_directories(dir / "src/a");
  fs::create_directories(dir / "src/b");
  fs::copy_file(kPhotos + "/chelsea.jpg", dir / "src/a/x.jpg");
  fs::copy_file(kPhotos + "/coffee.jpg", dir / "src/b/y.jpg");
  ingest::SourceList folder, listed;
  REQUIRE(ingest::ListSources(dir / "src", "", &folder).ok());
  CHECK(folder.layout == "imagefolder");
  WriteFile(dir / "l.txt", "a/x.jpg 0\nb/y.jpg 1\n");
  REQUIRE(ingest::ListSources(dir / "src", dir / "l.txt", &listed).ok());
  CHECK(listed.layout == "list");
  REQUIRE(listed.items.size() == 2);
  const std::string d = ingest::SourceDigest(folder);
  CHECK(d.size() == 16);
  CHECK(ingest::SourceDigest(listed) == d);  // same paths, labels, sizes, mtimes
  WriteFile(dir / "l2.txt", "a/x.jpg 1\nb/y.jpg 0\n");
  REQUIRE(ingest::ListSources(dir / "src", dir / "l2.txt", &listed).ok());
  CHECK(ingest::SourceDigest(listed) != d);  // labels swapped
}

TEST_CASE("sources.tsv round-trips every field and names a bad line", "[sources]") {
  TempDir dir;
  std::vector<ingest::RecordedSource> in(3);
  in[0].record = 0;
  in[0].item = {"a/x.jpg", 0, 1234, 1700000000123456789};
  in[1].record = -1;
  in[1].item = {"a/y z.png", 0, 5, 1};
  in[2].record = 1;
  in[2].item = {"b/\xc3\xa9.jpg", 1, 77, -5};
  REQUIRE(ingest::WriteSourcesTsv(dir / "sources.tsv", in).ok());
  std::vector<ingest::RecordedSource> out;
  REQUIRE(ingest::ReadSourcesTsv(dir / "sources.tsv", &out).ok());
  REQUIRE(out.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK(out[i].record == in[i].record);
    CHECK(out[i].item.rel_path == in[i].item.rel_path);
    CHECK(out[i].item.label == in[i].item.label);
    CHECK(out[i].item.size == in[i].item.size);
    CHECK(out[i].item.mtime_ns == in[i].item.mtime_ns);
  }
  CHECK(ingest::ReadSourcesTsv(dir / "absent.tsv", &out).IsNotFound());
  std::string text = ReadFile(dir / "sources.tsv");
  text += "not a line\n";
  WriteFile(dir / "bad.tsv", text);
  Status s = ingest::ReadSourcesTsv(dir / "bad.tsv", &out);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("bad.tsv"));
}

TEST_CASE("sources.tsv numbers are exactly what kiln writes", "[sources]") {
  // Regression: std::stoull read a size of "-1" as 2^64 - 1, std::stoll
  // read "12abc" as 12 and " 12" as 12.
  const std::string header = "record\tpath\tlabel\tsize\tmtime_ns\n";
  std::vector<ingest::RecordedSource> out;
  REQUIRE(ingest::ParseSourcesTsv(header + "-1\ta.jpg\t0\t5\t-7\n", "s.tsv", &out).ok());
  REQUIRE(out.size() == 1);
  CHECK(out[0].record == -1);
  CHECK(out[0].item.mtime_ns == -7);
  for (const char* line :
       {"0\ta.jpg\t0\t-1\t1", "0\ta.jpg\t0\t12abc\t1", "0\ta.jpg\t0\t 12\t1", "0\ta.jpg\t0\t+12\t1",
        "-2\ta.jpg\t0\t1\t1", "x\ta.jpg\t0\t1\t1", "0\ta.jpg\t99999999999999999999\t1\t1",
        "0\ta.jpg\t0\t1\t", "0\ta\\q.jpg\t0\t1\t1"}) {
    out.clear();
    const Status s = ingest::ParseSourcesTsv(header + line + "\n", "s.tsv", &out);
    INFO(line << ": " << s.ToString());
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("s.tsv:2"));
    CHECK(out.empty());
  }
}
