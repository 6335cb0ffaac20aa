// kiln_dump_records: writes records of a cache as read by kiln::CacheReader,
// so that other readers (tools/kiln_torch.py) can be compared byte for byte.
//
// Usage: kiln_dump_records CACHE OUT [INDEX...]   (no INDEX: every record)
//
// OUT holds, for each record in the order given:
//   u64 index, i64 label, u64 payload_bytes (little-endian), then the payload.
// Every record's checksum is verified. Exit status 0 ok, 1 on a read error,
// 2 on a usage error.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/cache_reader.h"

namespace {

void PutU64(std::FILE* f, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  std::fwrite(b, 1, 8, f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CACHE OUT [INDEX...]\n", argv[0]);
    return 2;
  }
  std::unique_ptr<kiln::CacheReader> reader;
  kiln::Status s = kiln::CacheReader::Open(argv[1], kiln::ReaderOptions{}, &reader);
  if (!s.ok()) {
    std::fprintf(stderr, "kiln_dump_records: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<uint64_t> indices;
  if (argc == 3) {
    for (uint64_t i = 0; i < reader->size(); ++i) indices.push_back(i);
  } else {
    for (int a = 3; a < argc; ++a) {
      char* end = nullptr;
      errno = 0;
      unsigned long long v = std::strtoull(argv[a], &end, 10);
      if (errno != 0 || end == argv[a] || *end != '\0' || argv[a][0] == '-') {
        std::fprintf(stderr, "kiln_dump_records: bad index '%s'\n", argv[a]);
        return 2;
      }
      indices.push_back(v);
    }
  }
  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "kiln_dump_records: cannot write %s: %s\n", argv[2],
                 std::strerror(errno));
    return 2;
  }
  std::unique_ptr<kiln::ReadTxn> txn = reader->BeginRead();
  for (uint64_t index : indices) {
    kiln::RecordView v;
    s = txn->Get(index, &v, /*verify_checksum=*/true);
    if (!s.ok()) {
      std::fprintf(stderr, "kiln_dump_records: %s\n", s.ToString().c_str());
      std::fclose(out);
      return 1;
    }
    PutU64(out, v.index);
    PutU64(out, static_cast<uint64_t>(v.label));
    PutU64(out, v.bytes);
    std::fwrite(v.data, 1, v.bytes, out);
    txn->Reset();
  }
  if (std::fclose(out) != 0) {
    std::fprintf(stderr, "kiln_dump_records: write error on %s\n", argv[2]);
    return 2;
  }
  return 0;
}
