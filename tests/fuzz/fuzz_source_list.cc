// libFuzzer target: the list file and CSV of `kiln build --list`.
// Input: one byte choosing the format (even: a "path label" list, odd: a
// CSV), then the file's text. Files "exist" by a hash of their path, so no
// file system is touched. What the parser accepts must hold only paths
// inside the root, sorted and distinct, with labels naming its classes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>

#include "fuzz_check.h"
#include "source_list.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string list_path = data[0] % 2 ? "list.csv" : "list.txt";
  std::istringstream in(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  auto stat = [](kiln::ingest::SourceItem* item) {
    const size_t h = std::hash<std::string>()(item->rel_path);
    item->size = h % 1000;
    item->mtime_ns = static_cast<int64_t>(h % 77);
    // One in five listed files is missing, one in seven unreadable for now.
    if (h % 5 == 0) return kiln::Status::NotFound("listed but not found");
    if (h % 7 == 0) return kiln::Status::IOError("Permission denied");
    return kiln::Status::OK();
  };
  kiln::ingest::SourceList list;
  if (!kiln::ingest::ParseSourceList(in, list_path, "/root", stat, &list).ok()) return 0;
  KILN_FUZZ_CHECK(list.root == "/root");
  KILN_FUZZ_CHECK(!list.items.empty());
  for (size_t i = 0; i < list.items.size(); ++i) {
    const kiln::ingest::SourceItem& it = list.items[i];
    KILN_FUZZ_CHECK(!it.rel_path.empty() && it.rel_path[0] != '/');
    for (const auto& part : std::filesystem::path(it.rel_path)) KILN_FUZZ_CHECK(part != "..");
    if (list.multi_label) {
      // Several labels: each within the classes, sorted, once; no single one.
      KILN_FUZZ_CHECK(it.label == -1);
      for (size_t k = 0; k < it.labels.size(); ++k) {
        KILN_FUZZ_CHECK(it.labels[k] >= 0 &&
                        static_cast<size_t>(it.labels[k]) < list.classes.size());
        if (k > 0) KILN_FUZZ_CHECK(it.labels[k - 1] < it.labels[k]);
      }
    } else {
      KILN_FUZZ_CHECK(it.label >= 0 && static_cast<size_t>(it.label) < list.classes.size());
    }
    KILN_FUZZ_CHECK(it.targets.size() == list.target_names.size());
    for (float t : it.targets) KILN_FUZZ_CHECK(std::isfinite(t));
    if (i > 0) KILN_FUZZ_CHECK(list.items[i - 1].rel_path < it.rel_path);
  }
  for (const kiln::ingest::SourceReject& r : list.rejected) {
    KILN_FUZZ_CHECK(r.reason.compare(0, list_path.size(), list_path) == 0);  // names its line
    KILN_FUZZ_CHECK(!r.retry || r.reason.find("Permission denied") != std::string::npos);
  }
  (void)kiln::ingest::SourceDigest(list);
  return 0;
}
