#include "test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/manifest.h"

namespace kiln::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kiln_test_XXXXXX").string();
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<uint8_t> TestPayload(uint64_t index, DType dtype, size_t bytes) {
  std::vector<uint8_t> p(bytes);
  uint64_t x = index * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x);
  }
  if (dtype != DType::kUint8) {
    // Keep float elements finite: clear the top exponent bit (little-endian).
    const size_t es = DTypeSize(dtype);
    for (size_t j = es - 1; j < bytes; j += es) p[j] &= 0x3F;
  }
  return p;
}

Shape MakeShape(std::initializer_list<uint32_t> dims) {
  Shape s;
  for (uint32_t d : dims) s.dims[s.ndim++] = d;
  return s;
}

FieldSpec MakeFieldSpec(const std::string& name, DType dtype, std::vector<int64_t> dims) {
  FieldSpec f;
  f.name = name;
  f.dtype = dtype;
  f.ndim = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) f.dims[i] = dims[i];
  return f;
}

void WriteTestCache(const std::string& dir, uint64_t n, DType dtype, const Shape& shape,
                    int classes, uint64_t shard_size) {
  WriterOptions o;
  o.dtype = dtype;
  o.shape = shape;
  o.shard_size = shard_size;
  std::unique_ptr<CacheWriter> w;
  Status s = CacheWriter::Open(o, dir, &w);
  REQUIRE(s.ok());
  const size_t bytes = shape.NumElements() * DTypeSize(dtype);
  for (uint64_t i = 0; i < n; ++i) {
    auto p = TestPayload(i, dtype, bytes);
    REQUIRE(w->Append(i, static_cast<int64_t>(i % classes), p.data()).ok());
  }
  Manifest m;
  for (int c = 0; c < classes; ++c) m.classes.push_back("class" + std::to_string(c));
  s = w->Finish(&m);
  REQUIRE(s.ok());
}

int StartProcess(const std::vector<std::string>& argv, const std::string& output) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int fd = output.empty() ? ::open("/dev/null", O_WRONLY)
                                  : ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

int WaitExit(int pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string FreeLocalPort() {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(sock);
  return std::to_string(ntohs(a.sin_port));
}

int RunCommand(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* f = popen(full.c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  output->clear();
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) output->append(buf, n);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool OnTmpfs(const std::string& path) {
  struct statfs st;
  return statfs(path.c_str(), &st) == 0 && st.f_type == TMPFS_MAGIC;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

size_t PayloadOffset(const std::string& file_bytes, uint64_t i, DType dtype, size_t record_bytes) {
  const auto want = TestPayload(i, dtype, record_bytes);
  const void* p = memmem(file_bytes.data(), file_bytes.size(), want.data(),
                         std::min<size_t>(64, record_bytes));
  REQUIRE(p != nullptr);
  return static_cast<const char*>(p) - file_bytes.data();
}

void FlipByte(const std::string& path, size_t offset) {
  std::string b = ReadFile(path);
  REQUIRE(offset < b.size());
  b[offset] ^= 0x10;
  WriteFile(path, b);
}

}  // namespace kiln::testing
