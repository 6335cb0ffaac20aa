// Helpers shared by kiln's tests: temp directories and small caches.
#ifndef KILN_TESTS_TEST_UTIL_H_
#define KILN_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cache_writer.h"
#include "kiln/record.h"
#include "test_skip.h"

namespace kiln::testing {

// A fresh empty directory under $TMPDIR, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The payload that WriteTestCache writes for record `index`: deterministic
// bytes; for float dtypes every element is finite.
std::vector<uint8_t> TestPayload(uint64_t index, DType dtype, size_t bytes);

// Writes a cache of `n` records (labels index % classes) to `dir`.
void WriteTestCache(const std::string& dir, uint64_t n, DType dtype, const Shape& shape,
                    int classes = 10, uint64_t shard_size = 1ull << 30);

Shape MakeShape(std::initializer_list<uint32_t> dims);

// A format 2 field: its name, dtype and dims (FieldSpec::kVariableDim for a
// dim that varies; none for a scalar).
FieldSpec MakeFieldSpec(const std::string& name, DType dtype, std::vector<int64_t> dims);

// Runs a shell command, returning its exit status; stdout+stderr go to *output.
int RunCommand(const std::string& cmd, std::string* output);

// Starts `argv` (argv[0] the program's path) without waiting, its stdout
// and stderr to the file `output` ("" = /dev/null); returns its pid.
int StartProcess(const std::vector<std::string>& argv, const std::string& output = "");
// Waits for process `pid`: its exit status, or 128 + the signal that ended it.
int WaitExit(int pid);
// A TCP port of 127.0.0.1 that is free at the moment of the call.
std::string FreeLocalPort();

// True when `path` lies on tmpfs, whose pages are the files themselves:
// they cannot be dropped from the page cache, so no cache there is cold.
bool OnTmpfs(const std::string& path);

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& content);

// Offset of record i's payload, as WriteTestCache wrote it, inside a shard
// file's bytes (found by its first bytes, at most 64).
size_t PayloadOffset(const std::string& file_bytes, uint64_t i, DType dtype, size_t record_bytes);
// Flips one bit of the byte at `offset` of file `path`.
void FlipByte(const std::string& path, size_t offset);

}  // namespace kiln::testing

#endif  // KILN_TESTS_TEST_UTIL_H_
