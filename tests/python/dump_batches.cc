// kiln_dump_batches: writes the batches of one epoch as kiln::Loader yields
// them, so that the Python module can be compared with it byte for byte.
//
// Usage: kiln_dump_batches CACHE OUT KEY=VALUE...
//   keys: batch seed rank world shuffle drop_last crop random_crop flip
//         epoch start workers (integers; booleans 0/1)
//
// OUT holds, for each batch: u64 index, u64 size (little-endian), then the
// size labels as i64 and the size samples' bytes. Exit status 0 ok, 1 on a
// load error, 2 on a usage error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/loader.h"

namespace {

void PutU64(std::FILE* f, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  std::fwrite(b, 1, 8, f);
}

int Fail(const kiln::Status& s) {
  std::fprintf(stderr, "kiln_dump_batches: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CACHE OUT KEY=VALUE...\n", argv[0]);
    return 2;
  }
  std::map<std::string, long long> kv = {{"batch", 8}, {"seed", 0}, {"rank", 0},
                                         {"world", 1}, {"shuffle", 1}, {"drop_last", 0},
                                         {"crop", 0}, {"random_crop", 0}, {"flip", 0},
                                         {"epoch", 0}, {"start", 0}, {"workers", 2}};
  for (int a = 3; a < argc; ++a) {
    const std::string arg = argv[a];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const char* value = eq == std::string::npos ? "" : argv[a] + eq + 1;
    char* end = nullptr;
    const long long v = std::strtoll(value, &end, 10);
    if (eq == std::string::npos || kv.count(key) == 0 || end == value || *end != '\0') {
      std::fprintf(stderr, "kiln_dump_batches: bad argument '%s'\n", argv[a]);
      return 2;
    }
    kv[key] = v;
  }
  std::unique_ptr<kiln::CacheReader> reader;
  kiln::Status s = kiln::CacheReader::Open(argv[1], kiln::ReaderOptions{}, &reader);
  if (!s.ok()) return Fail(s);
  kiln::LoaderOptions o;
  o.batch_size = kv["batch"];
  o.seed = kv["seed"];
  o.rank = kv["rank"];
  o.world_size = kv["world"];
  o.shuffle = kv["shuffle"] != 0;
  o.drop_last = kv["drop_last"] != 0;
  o.crop = kv["crop"];
  o.random_crop = kv["random_crop"] != 0;
  o.random_flip = kv["flip"] != 0;
  o.workers = kv["workers"];
  // Sized by the record (a crop only shrinks a sample).
  const uint64_t bytes = o.batch_size * reader->record_bytes();
  std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(bytes));
  std::vector<std::vector<int64_t>> labels(3, std::vector<int64_t>(o.batch_size));
  std::vector<kiln::BatchSlot> slots;
  for (int i = 0; i < 3; ++i) {
    kiln::BatchSlot slot;
    slot.data = data[i].data();
    slot.labels = labels[i].data();
    slots.push_back(slot);
  }
  std::unique_ptr<kiln::Loader> loader;
  s = kiln::Loader::Open(reader.get(), o, slots, &loader);
  if (!s.ok()) return Fail(s);
  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "kiln_dump_batches: cannot write %s\n", argv[2]);
    return 2;
  }
  s = loader->StartEpoch(kv["epoch"], kv["start"]);
  while (s.ok()) {
    kiln::Batch b;
    s = loader->Next(&b);
    if (!s.ok()) break;
    PutU64(out, b.index);
    PutU64(out, b.size);
    std::fwrite(labels[b.slot].data(), sizeof(int64_t), b.size, out);
    std::fwrite(data[b.slot].data(), 1, b.size * loader->sample_bytes(), out);
    loader->Release(b.slot);
  }
  std::fclose(out);
  if (!s.IsNotFound()) return Fail(s);
  return 0;
}
