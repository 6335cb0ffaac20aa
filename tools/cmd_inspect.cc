// kiln inspect CACHE: what a cache holds and how it was made.
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "kiln/cache_reader.h"

namespace kiln::tools {
namespace {

int RunInspect(const std::string& dir, bool as_json) {
  std::unique_ptr<CacheReader> reader;
  ReaderOptions ro;
  ro.allow_part = true;  // a part of a cache built in parts can be looked at
  Status s = CacheReader::Open(dir, ro, &reader);
  if (!s.ok()) return ReportError("inspect", s);
  const Manifest& m = reader->manifest();
  if (as_json) {
    std::cout << ManifestToJson(m);
    return kExitOk;
  }
  uint64_t disk = 0;
  for (const ShardInfo& sh : m.shards) disk += sh.bytes;
  std::cout << "cache:         " << dir << "\n"
            << "format:        kiln-cache v" << m.format_version << " (written by kiln "
            << m.kiln_version << ")\n"
            << "records:       " << m.count;
  if (m.is_part())
    std::cout << " (part " << m.part_index << " of " << m.part_count << ", from 0: records "
              << m.first_index << ".." << m.first_index + m.count - 1
              << " of the whole cache; join the parts with kiln merge)";
  std::cout << "\n"
            << "sample:        " << DTypeName(m.dtype) << " " << m.shape.ToString() << " ("
            << HumanBytes(static_cast<double>(reader->record_bytes())) << " each)\n"
            << "classes:       " << m.classes.size();
  for (size_t i = 0; i < m.classes.size() && i < 20; ++i)
    std::cout << (i ? ", " : " (") << i << "=" << m.classes[i];
  if (!m.classes.empty()) std::cout << (m.classes.size() > 20 ? ", ...)" : ")");
  std::cout << "\nsize on disk:  " << HumanBytes(static_cast<double>(disk)) << " in "
            << m.shards.size() << " shard" << (m.shards.size() == 1 ? "" : "s") << "\n";
  for (const ShardInfo& sh : m.shards)
    std::cout << "  " << sh.file << "  records " << sh.first << ".."
              << (sh.count ? sh.first + sh.count - 1 : sh.first) << " (" << sh.count << ")  "
              << HumanBytes(static_cast<double>(sh.bytes)) << "  digest " << sh.digest << "\n";
  const auto pre = nlohmann::json::parse(m.preprocessing.ToJson());
  std::cout << "preprocessing:";
  if (pre.is_object() && !pre.empty()) {
    std::cout << "\n";
    for (auto it = pre.begin(); it != pre.end(); ++it)
      std::cout << "  " << it.key() << ": " << it.value().dump() << "\n";
  } else {
    std::cout << " (none recorded)\n";
  }
  return kExitOk;
}

KILN_COMMAND(Command{"inspect", "Summarize a cache: records, shape, dtype, classes, shards, preprocessing", 30,
                     [](CLI::App* sub) -> std::function<int()> {
                       auto dir = std::make_shared<std::string>();
                       auto as_json = std::make_shared<bool>(false);
                       sub->add_option("CACHE", *dir, "cache directory")->required();
                       sub->add_flag("--json", *as_json, "print the manifest as JSON");
                       AddExamples(sub, {"kiln inspect OUT/train", "kiln inspect OUT --json"});
                       return [dir, as_json] { return RunInspect(*dir, *as_json); };
                     }});

}  // namespace
}  // namespace kiln::tools
