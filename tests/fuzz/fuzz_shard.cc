// libFuzzer target: a shard file. CheckLmdbFile (core/lmdb_check.h) must
// refuse every file on which LMDB's read path would run off its pages:
// what it accepts, LMDB opens and walks - every key and value read to its
// last byte, every key looked up again as the loader does - without a
// crash, and the walk meets as many entries as the check counted.
#include <lmdb.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/lmdb_check.h"
#include "core/lmdb_env.h"
#include "fuzz_check.h"

namespace {

// One scratch file per process, removed at exit with its lock file.
char g_path[] = "/tmp/kiln_fuzz_shard.XXXXXX";

void RemoveScratch() {
  std::remove(g_path);
  std::remove((std::string(g_path) + "-lock").c_str());
}

const char* ScratchPath() {
  static const bool made = [] {
    const int fd = mkstemp(g_path);
    if (fd < 0) std::abort();
    close(fd);
    std::atexit(RemoveScratch);
    return true;
  }();
  (void)made;
  return g_path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ScratchPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  kiln::LmdbFileSummary summary;
  // The walk every reader runs at open, the lighter one: what it accepts
  // must be safe for LMDB's whole read path.
  if (!kiln::CheckLmdbFile(path, size, &summary).ok()) return 0;
  kiln::LmdbEnv env;
  if (!env.OpenForRead(path, 4).ok()) return 0;
  kiln::LmdbTxn txn;
  if (!txn.Begin(env, true).ok()) return 0;
  uint64_t walked = 0;
  uint8_t sum = 0;
  const kiln::Status s = kiln::ForEachRecord(env, txn, [&](const MDB_val& k, const MDB_val& v) {
    ++walked;
    for (size_t i = 0; i < k.mv_size; ++i) sum += static_cast<const uint8_t*>(k.mv_data)[i];
    for (size_t i = 0; i < v.mv_size; ++i) sum += static_cast<const uint8_t*>(v.mv_data)[i];
    MDB_val key = k, found;
    (void)mdb_get(txn.get(), env.dbi(), &key, &found);  // unsorted keys: not found, no crash
    return true;
  });
  if (s.ok()) KILN_FUZZ_CHECK(walked == summary.entries);
  volatile uint8_t keep = sum;  // the reads are not optimized away
  (void)keep;
  return 0;
}
