// MergeCaches (kiln merge --from A --from B OUT): finished caches with the
// same fields and recipe join in order, classes matched by name; caches
// that differ are refused with the reason. The command line: tests/tools.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "ingest_test_util.h"
#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// Fashion-MNIST's sample classes whose folder names start with a digit in
// `digits`, every file (`half` 0) or the even (1) or odd (2) ones.
void CopyClasses(const std::string& to, const std::string& digits, int half = 0) {
  for (const auto& cls : fs::directory_iterator(kFashion)) {
    const std::string name = cls.path().filename().string();
    if (digits.find(name[0]) == std::string::npos) continue;
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(cls.path())) files.push_back(f.path());
    std::sort(files.begin(), files.end());
    fs::create_directories(fs::path(to) / name);
    for (size_t i = 0; i < files.size(); ++i)
      if (half == 0 || static_cast<int>(i % 2) == half - 1)
        fs::copy_file(files[i], fs::path(to) / name / files[i].filename());
  }
}

ingest::BuildOptions Options(const std::string& src, const std::string& out) {
  ingest::BuildOptions o = BuildOf(src, out);
  o.channels = 1;
  o.norm = NormKind::kExplicit;  // the same for every source tree
  o.mean = {0.3};
  o.std = {0.35};
  o.shard_size = 60 * 28 * 28 * 2;  // several shards
  return o;
}

// Every record: (class name, payload bytes).
std::vector<std::pair<std::string, std::string>> Records(const std::string& dir) {
  std::unique_ptr<CacheReader> r;
  const Status s = CacheReader::Open(dir, ReaderOptions(), &r);
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto txn = r->BeginRead();
  std::vector<std::pair<std::string, std::string>> out;
  for (uint64_t i = 0; i < r->size(); ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, true).ok());
    out.emplace_back(r->manifest().classes.at(static_cast<size_t>(v.label)),
                     std::string(reinterpret_cast<const char*>(v.data), v.bytes));
    txn->Reset();
  }
  return out;
}

struct Merged {
  Status status;
  ingest::MergeResult result;
  std::string log;
};

Merged Merge(const std::string& out, const std::vector<std::string>& from) {
  Merged m;
  m.status = ingest::MergeCaches(
      out, from, [&m](const std::string& l) { m.log += l + "\n"; }, &m.result);
  return m;
}

ino_t Inode(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_ino;
}

}  // namespace

TEST_CASE("merge --from joins two caches in order, classes matched by name, linking every shard",
          "[build][merge]") {
  TempDir srcA, srcB, a, b, out;
  CopyClasses(srcA.path(), "01234");
  CopyClasses(srcB.path(), "3456789");  // 3 and 4 shared, the rest new, in another position
  REQUIRE(Build(Options(srcA.path(), a.path())).status.ToString() == "OK");
  REQUIRE(Build(Options(srcB.path(), b.path())).status.ToString() == "OK");
  const auto files_a = CacheFiles(a.path()), files_b = CacheFiles(b.path());
  Manifest ma, mb;
  REQUIRE(ReadManifest(a.path(), &ma).ok());
  REQUIRE(ReadManifest(b.path(), &mb).ok());

  const Merged m = Merge(out.path(), {a.path(), b.path()});
  REQUIRE(m.status.ToString() == "OK");
  CHECK(m.result.records == ma.count + mb.count);
  // B's classes are numbered otherwise: its shards are linked all the
  // same, read with a label map; no record is written again.
  CHECK(m.result.copied_records == 0);
  CHECK(m.result.relabelled_records == mb.count);
  CHECK_THAT(m.log, Catch::Contains("labels mapped"));
  Manifest merged;
  REQUIRE(ReadManifest(out.path(), &merged).ok());
  REQUIRE(merged.classes.size() == 10);  // 0..4 from A, then 5..9 from B
  for (size_t i = 0; i < 10; ++i) CHECK(merged.classes[i][0] == static_cast<char>('0' + i));
  // A's records, then B's, each with its own class name and bytes.
  auto want = Records(a.path());
  const auto of_b = Records(b.path());
  want.insert(want.end(), of_b.begin(), of_b.end());
  CHECK(Records(out.path()) == want);
  // A's shards are linked, not copied, and so are B's, with B's labels
  // ("3" was 0 in B) mapped; the merged cache verifies; the inputs are untouched.
  CHECK(Inode(out / "shard-00000.mdb") == Inode(a / ma.shards[0].file));
  const ShardInfo& of_b0 = merged.shards[ma.shards.size()];
  CHECK(Inode(out / of_b0.file) == Inode(b / mb.shards[0].file));
  CHECK(of_b0.label_map == std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9});
  CHECK(merged.shards[0].label_map.empty());
  CHECK_THAT(ReadFile(out / kManifestName), Catch::Contains("\"label_map\": [") &&
                                                Catch::Contains("\"format_version\": 3"));
  CHECK(Problems(out.path()) == "");
  {
    // The label field reads as the mapped label too (format 1: the header's int64).
    std::unique_ptr<CacheReader> r;
    REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &r).ok());
    RecordView v;
    REQUIRE(r->BeginRead()->Get(ma.count, &v, true).ok());
    int64_t field = -1;
    REQUIRE(v.fields[1].bytes == 8);
    std::memcpy(&field, v.fields[1].data, 8);
    CHECK(field == v.label);
    CHECK(merged.classes.at(static_cast<size_t>(v.label)) == of_b.front().first);
  }
  // A and B share the images of classes 3 and 4 under the same names: the
  // duplicate report finds them, and no label conflict (B stored 0 and 1).
  CHECK(m.result.duplicates.groups > 0);
  CHECK(m.result.duplicates.label_conflicts == 0);
  // --repair cannot rewrite a linked shard in place.
  RecordFix fix;
  fix.index = ma.count;
  CHECK(kiln::RewriteRecords(out.path(), {fix}).IsNotSupported());
  // A label map that points past the classes is a damaged manifest.
  {
    TempDir edited;  // ReadManifest reads the manifest alone
    std::string text = ReadFile(out / kManifestName);
    const size_t at = text.find("\"label_map\": [") + 14;
    text.insert(at, "10, ");
    WriteFile(edited / kManifestName, text);
    Manifest bad;
    const Status s = ReadManifest(edited.path(), &bad);
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("label_map[0]") && Catch::Contains("0..9"));
    // A map shorter than the labels B's records store: those records are
    // named as damaged, by verify and by the reader.
    TempDir shorter;
    for (const auto& [name, bytes] : CacheFiles(out.path()))
      if (name.find('/') == std::string::npos) WriteFile(shorter / name, bytes);
    text = ReadFile(out / kManifestName);
    const size_t from = text.find("\"label_map\": [") + 14;
    text.replace(from, text.find(']', from) - from, "3");
    WriteFile(shorter / kManifestName, text);
    CHECK_THAT(Problems(shorter.path()),
               Catch::Contains("outside the 1 classes of the cache its shard") &&
                   Catch::Contains("was linked from"));
    std::unique_ptr<CacheReader> r;
    REQUIRE(CacheReader::Open(shorter.path(), ReaderOptions(), &r).ok());
    auto txn = r->BeginRead();
    bool named = false;
    for (uint64_t i = ma.count; i < ma.count + of_b0.count && !named; ++i) {
      RecordView v;
      const Status got = txn->Get(i, &v);
      named = got.IsCorruption() && got.message().find("was linked from") != std::string::npos;
      txn->Reset();
    }
    CHECK(named);
  }
  CHECK(CacheFiles(a.path()) == files_a);
  CHECK(CacheFiles(b.path()) == files_b);
  // The manifest says where the records came from.
  REQUIRE(merged.appends.size() == 1);
  CHECK(merged.appends[0].count_before == ma.count);
  CHECK(merged.appends[0].count_after == ma.count + mb.count);
  CHECK_THAT(merged.appends[0].from, Catch::Contains(b.path()));
  CHECK_THAT(merged.preprocessing.ToJson(), Catch::Contains("\"merged\""));
  CHECK(fs::exists(out / kDuplicatesTsvName));
  // A's sources alone no longer make this cache: a build of them calls it stale.
  const Built again = Build(Options(srcA.path(), out.path()));
  CHECK(again.status.IsStale());
  CHECK_THAT(again.status.message(), Catch::Contains("merged"));
  // --append has no one source tree to add to: it says so and what to do.
  ingest::BuildOptions append = Options(srcA.path(), out.path());
  append.append = true;
  const Built appended = Build(append);
  CHECK(appended.status.IsInvalidArgument());
  CHECK_THAT(appended.status.message(), Catch::Contains("a merge of several caches") &&
                                            Catch::Contains("merge again"));
  // The merged cache merges on with a third (classes already there).
  TempDir srcC, c, out2;
  CopyClasses(srcC.path(), "9");
  REQUIRE(Build(Options(srcC.path(), c.path())).status.ToString() == "OK");
  const Merged m2 = Merge(out2.path(), {out.path(), c.path()});
  REQUIRE(m2.status.ToString() == "OK");
  Manifest three;
  REQUIRE(ReadManifest(out2.path(), &three).ok());
  CHECK(three.classes == merged.classes);
  CHECK(three.appends.size() == 2);
  CHECK(Records(out2.path()).back().first == merged.classes[9]);
  CHECK(m2.result.copied_records == 0);
  // The other way round, C's class first: the merged cache's label maps
  // compose with the new numbering ("9" is now 0, "0" is 1, ...).
  TempDir out3;
  const Merged m3 = Merge(out3.path(), {c.path(), out.path()});
  REQUIRE(m3.status.ToString() == "OK");
  CHECK(m3.result.copied_records == 0);
  auto want3 = Records(c.path());
  const auto of_out = Records(out.path());
  want3.insert(want3.end(), of_out.begin(), of_out.end());
  CHECK(Records(out3.path()) == want3);
  CHECK(Problems(out3.path()) == "");
}

TEST_CASE("merge --from with equal classes keeps the labels, and resumes after a kill",
          "[build][merge]") {
  TempDir srcA, srcB, a, b, out;
  CopyClasses(srcA.path(), "0123456789", 1);
  CopyClasses(srcB.path(), "0123456789", 2);
  REQUIRE(Build(Options(srcA.path(), a.path())).status.ToString() == "OK");
  REQUIRE(Build(Options(srcB.path(), b.path())).status.ToString() == "OK");
  const Merged first = Merge(out.path(), {a.path(), b.path()});
  REQUIRE(first.status.ToString() == "OK");
  auto want = Records(a.path());
  const auto of_b = Records(b.path());
  want.insert(want.end(), of_b.begin(), of_b.end());
  CHECK(Records(out.path()) == want);
  // The same classes: B's shards are linked too, keeping B's keys; the
  // manifest says so in a way an older kiln refuses (format 3).
  CHECK(first.result.copied_records == 0);
  Manifest ma, mo;
  REQUIRE(ReadManifest(a.path(), &ma).ok());
  REQUIRE(ReadManifest(out.path(), &mo).ok());
  REQUIRE(mo.shards.size() > ma.shards.size());
  const ShardInfo& linked = mo.shards[ma.shards.size()];
  CHECK(linked.keyed);
  CHECK(linked.first == ma.count);
  CHECK(linked.key_first == 0);
  CHECK(Inode(out / linked.file) == Inode(b / ShardFileName(0)));
  CHECK_FALSE(mo.shards[0].keyed);
  CHECK_THAT(ReadFile(out / kManifestName), Catch::Contains("\"format_version\": 3") &&
                                                Catch::Contains("\"record_format\": 1") &&
                                                Catch::Contains("\"key_first\": 0"));
  CHECK(Problems(out.path()) == "");
  // Repair cannot rewrite a linked shard in place: it names the cache to repair.
  RecordFix fix;
  fix.index = ma.count;
  const Status repaired = kiln::RewriteRecords(out.path(), {fix});
  CHECK(repaired.IsNotSupported());
  CHECK_THAT(repaired.message(), Catch::Contains("linked unchanged from another cache"));
  const auto files = CacheFiles(out.path());
  // Killed before the manifest was published: links and a scratch
  // directory are left; the merge run again ends with the same bytes
  // (but the time in the appends entry).
  fs::remove(out / kManifestName);
  fs::create_directories(out / ".merge-from-1");
  const Merged again = Merge(out.path(), {a.path(), b.path()});
  REQUIRE(again.status.ToString() == "OK");
  for (const auto& [name, bytes] : files)
    if (name != kManifestName) CHECK(ReadFile(out / name) == bytes);
  CHECK(!fs::exists(out / ".merge-from-1"));
  CHECK(Problems(out.path()) == "");
  // Killed, then run with other inputs: the shard files past the new
  // merge's (from the larger first run) go before the manifest is written.
  fs::remove(out / kManifestName);
  const std::string stray = ShardFileName(static_cast<int>(files.size()) + 3);
  fs::copy_file(out / ShardFileName(0), out / stray);
  WriteFile(out / (stray + kLmdbLockSuffix), "");
  const Merged other = Merge(out.path(), {b.path(), a.path()});
  REQUIRE(other.status.ToString() == "OK");
  CHECK(!fs::exists(out / stray));
  CHECK(!fs::exists(out / (stray + kLmdbLockSuffix)));
  CHECK(Problems(out.path()) == "");
  // Damage in a linked shard (A's, now after B's records; a copy of it, so
  // that A stays intact) is named by the record's index in OUT, with its key.
  Manifest now;
  REQUIRE(ReadManifest(out.path(), &now).ok());
  int si = -1;
  for (size_t k = 0; k < now.shards.size(); ++k)
    if (now.shards[k].keyed && now.shards[k].key_first == 0) si = static_cast<int>(k);
  REQUIRE(si >= 0);
  const uint64_t index = now.shards[si].first + 2;
  size_t offset = 0;  // a payload byte of that record in the shard file
  {
    std::unique_ptr<CacheReader> before;
    REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &before).ok());
    const uint8_t* value = nullptr;
    uint64_t size = 0;
    REQUIRE(before->BeginRead()->Locate(index, &value, &size).ok());
    offset = static_cast<size_t>(value - before->mapping(si).base) + size - 7;
  }
  const std::string shard = out / now.shards[si].file;
  fs::copy_file(shard, shard + ".copy");
  fs::rename(shard + ".copy", shard);
  FlipByte(shard, offset);
  CHECK_THAT(Problems(out.path()),
             Catch::Contains("record " + std::to_string(index) + " (key 2 of a shard linked") &&
                 Catch::Contains("checksum mismatch"));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &reader).ok());
  RecordView v;
  const Status read = reader->BeginRead()->Get(index, &v, /*verify_checksum=*/true);
  CHECK(read.IsCorruption());
  CHECK_THAT(read.message(), Catch::Contains("record " + std::to_string(index) + " (key 2"));
  CHECK(Problems(a.path()) == "");
}

TEST_CASE("merge --from refuses caches that differ, parts, and a used OUT", "[build][merge]") {
  TempDir src, a, b, part, out;
  CopyClasses(src.path(), "01");
  REQUIRE(Build(Options(src.path(), a.path())).status.ToString() == "OK");
  ingest::BuildOptions other = Options(src.path(), b.path());
  other.resize = 32;
  other.crop = 32;
  REQUIRE(Build(other).status.ToString() == "OK");
  Merged m = Merge(out.path(), {a.path(), b.path()});
  CHECK(m.status.IsInvalidArgument());
  CHECK_THAT(m.status.message(), Catch::Contains(b.path()) && Catch::Contains("resize"));
  CHECK(!fs::exists(out / kManifestName));

  ingest::BuildOptions p = Options(src.path(), part.path());
  p.num_parts = 2;
  p.part = 0;
  REQUIRE(Build(p).status.ToString() == "OK");
  m = Merge(out.path(), {a.path(), part / "part-00000-of-00002"});
  CHECK(m.status.IsInvalidArgument());
  CHECK_THAT(m.status.message(), Catch::Contains("kiln merge OUT"));

  m = Merge(out.path(), {a.path(), a.path()});
  CHECK_THAT(m.status.message(), Catch::Contains("given twice"));
  m = Merge(out.path(), {a.path()});
  CHECK_THAT(m.status.message(), Catch::Contains("two caches or more"));
  m = Merge(out.path(), {a.path(), out / "missing"});
  CHECK(m.status.IsNotFound());
  // OUT holding anything else is refused, and so is OUT holding a finished cache.
  WriteFile(out / "notes.txt", "mine");
  TempDir copy;
  CopyClasses(copy.path(), "01");
  TempDir c;
  REQUIRE(Build(Options(copy.path(), c.path())).status.ToString() == "OK");
  m = Merge(out.path(), {a.path(), c.path()});
  CHECK_THAT(m.status.message(), Catch::Contains("notes.txt"));
  m = Merge(b.path(), {a.path(), c.path()});
  CHECK_THAT(m.status.message(), Catch::Contains("already holds a finished cache"));
}

TEST_CASE("merge --from maps an int32 label field, read through the map and with pread",
          "[build][merge]") {
  // Two writer caches: label int32 and a fixed image field, the classes
  // of the second in another order.
  auto write = [](const std::string& dir, const std::vector<std::string>& classes, int seed) {
    WriterOptions o;
    o.fields = {MakeFieldSpec("label", DType::kInt32, {}),
                MakeFieldSpec("image", DType::kUint8, {1, 4, 4})};
    o.label_field = "label";
    o.initial_map_size = 1 << 20;
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(o, dir, &w).ok());
    for (uint64_t i = 0; i < 12; ++i) {
      const int32_t l = static_cast<int32_t>(i % classes.size());
      std::vector<uint8_t> pixels(16, static_cast<uint8_t>(seed + i));
      FieldData f[2] = {{DType::kInt32, Shape{}, &l},
                        {DType::kUint8, MakeShape({1, 4, 4}), pixels.data()}};
      REQUIRE(w->AppendFields(i, f, 2).ok());
    }
    Manifest meta;
    meta.classes = classes;
    REQUIRE(w->Finish(&meta).ok());
  };
  TempDir a, b, out;
  write(a.path(), {"cat", "dog"}, 0);
  write(b.path(), {"eel", "dog", "cat"}, 100);
  const Merged m = Merge(out.path(), {a.path(), b.path()});
  REQUIRE(m.status.ToString() == "OK");
  CHECK(m.result.copied_records == 0);
  CHECK(m.result.relabelled_records == 12);
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &r).ok());
  REQUIRE(r->manifest().classes == std::vector<std::string>{"cat", "dog", "eel"});
  auto txn = r->BeginRead();
  std::vector<uint8_t> header(r->read_header_bytes()), payload(r->record_bytes());
  for (uint64_t i = 12; i < 24; ++i) {
    INFO("record " << i);
    const std::string want = std::vector<std::string>{"eel", "dog", "cat"}[(i - 12) % 3];
    for (bool pread : {false, true}) {
      RecordView v;
      REQUIRE((pread ? txn->Read(i, header.data(), payload.data(), &v, true)
                     : txn->Get(i, &v, true))
                  .ok());
      CHECK(r->manifest().classes.at(static_cast<size_t>(v.label)) == want);
      int32_t field = -1;
      REQUIRE(v.fields[0].bytes == 4);
      std::memcpy(&field, v.fields[0].data, 4);
      CHECK(field == v.label);
      CHECK(v.data[0] == static_cast<uint8_t>(100 + i - 12));
      txn->Reset();
    }
  }
  CHECK(Problems(out.path()) == "");
}
