// kiln_consumer CACHE: reads every record of a cache once through
// kiln::Loader and prints how many it got, as a program built against the
// installed kiln package.
#include <kiln/cache_reader.h>
#include <kiln/loader.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {
int Fail(const std::string& why) {
  std::fprintf(stderr, "kiln_consumer: %s\n", why.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_consumer CACHE\n");
    return 2;
  }
  std::unique_ptr<kiln::CacheReader> reader;
  kiln::Status s = kiln::CacheReader::Open(argv[1], kiln::ReaderOptions(), &reader);
  if (!s.ok()) return Fail(s.ToString());

  kiln::LoaderOptions options;
  options.batch_size = 8;
  options.shuffle = false;
  options.verify_checksums = true;
  const uint64_t classes = reader->manifest().classes.size();
  std::vector<std::vector<uint8_t>> data(2, std::vector<uint8_t>(8 * reader->record_bytes()));
  std::vector<std::vector<int64_t>> labels(2, std::vector<int64_t>(8));
  std::vector<kiln::BatchSlot> slots;
  for (int i = 0; i < 2; ++i) slots.push_back({data[i].data(), labels[i].data()});
  std::unique_ptr<kiln::Loader> loader;
  s = kiln::Loader::Open(reader.get(), options, slots, &loader);
  if (s.ok()) s = loader->StartEpoch(0);
  uint64_t records = 0, batches = 0;
  kiln::Batch batch;
  while (s.ok() && (s = loader->Next(&batch)).ok()) {
    for (uint64_t i = 0; i < batch.size; ++i)
      if (labels[batch.slot][i] < 0 || static_cast<uint64_t>(labels[batch.slot][i]) >= classes)
        return Fail("a label out of range in batch " + std::to_string(batch.index));
    records += batch.size;
    ++batches;
    loader->Release(batch.slot);
  }
  if (!s.IsNotFound()) return Fail(s.ToString());
  std::printf("kiln_consumer: %llu records in %llu batches\n",
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(batches));
  return 0;
}
