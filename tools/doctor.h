// kiln doctor: the checklist for fast training on this machine. Each check
// gives one Finding: a level and one sentence that says what was found and
// what to do about it. The probes are here, apart from the subcommand
// (cmd_doctor.cc), so that tests call them with their own inputs.
//
// The GPU is probed through the CUDA driver library (dlopen + dlsym: no
// CUDA headers, nothing linked), so the kiln command stays free of CUDA and
// LibTorch and answers on machines without either.
//
// Thread-safety: every function may run on any thread; ProbeGpus
// initializes the CUDA driver of the calling process.
#ifndef KILN_TOOLS_DOCTOR_H_
#define KILN_TOOLS_DOCTOR_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln::tools {

enum class FindingLevel { kOk, kInfo, kWarn };
const char* FindingLevelName(FindingLevel level);  // "ok", "info", "warn"

struct Finding {
  FindingLevel level = FindingLevel::kInfo;
  std::string topic;  // "cpu", "memory", "gpu", "pinned memory", "cache", ...
  std::string text;   // one sentence: what was found; what to do
};

// "warn  cpu: ..." (the level padded so that topics line up).
std::string FormatFinding(const Finding& f);

struct DoctorOptions {
  std::string cache;                                      // cache directory to check; "" = none
  std::string cuda_library = "libcuda.so.1";              // the CUDA driver, loaded with dlopen
  uint64_t pinned_bytes = 64ull << 20;                    // page-locked host memory to try (bytes)
  std::string meminfo = "/proc/meminfo";                  // where RAM sizes are read
  std::string cgroup_cpu_max = "/sys/fs/cgroup/cpu.max";  // cgroup v2 CPU quota
  // "cuda" or "cuda:N": the user needs that GPU. Without one, RunDoctor
  // returns NotSupported("no CUDA device: ...") before any other check;
  // "" (default): the GPU is one finding among the others.
  std::string device;
};

// Runs every check, in the order of the functions below. Returns NotFound
// when options.cache is set but names no directory, NotSupported when
// options.device names a CUDA device this machine lacks (or an invalid
// device name: InvalidArgument); otherwise OK, with a
// cache that cannot be opened or fails `verify --level quick` reported as
// a warning and *cache_ok = false.
Status RunDoctor(const DoctorOptions& options, std::vector<Finding>* findings, bool* cache_ok);

// ---- The pieces.

// CPUs: those this process may use (affinity) and online, the cgroup's CPU
// quota (cpu.max "QUOTA PERIOD"; 0 when unlimited or unreadable), and the
// threads kiln starts by default.
struct CpuFacts {
  int usable = 0;         // sched_getaffinity
  int online = 0;         // sysconf(_SC_NPROCESSORS_ONLN)
  double quota = 0;       // CPUs of time per period the cgroup allows; 0 = no limit
  int pool_threads = 0;   // kiln build / verify (oneTBB's default arena)
  int train_threads = 0;  // kiln train's intra-op threads on the CPU
  bool native_bf16 = false;  // CpuHasNativeBf16: kiln train's --precision auto is bf16 on the CPU
};
CpuFacts ProbeCpus(const std::string& cgroup_cpu_max);
Finding CpuFinding(const CpuFacts& cpu);

struct MemInfo {
  uint64_t total = 0;      // MemTotal, bytes
  uint64_t available = 0;  // MemAvailable, bytes
  uint64_t cgroup_limit = 0;  // this process's memory cgroup limit, bytes; 0 = none
  // What the page cache can hold for this process: MemAvailable, capped by
  // the cgroup's limit.
  uint64_t usable() const { return cgroup_limit ? std::min(available, cgroup_limit) : available; }
};
// Parses /proc/meminfo's text. Returns Corruption without both fields.
Status ParseMemInfo(const std::string& text, MemInfo* out);
Finding MemoryFinding(const MemInfo& mem);

// The filesystem a statfs f_type names ("ext2/ext3/ext4", "nfs", ...;
// "unknown (0x...)" otherwise), and whether its reads go over a network.
std::string FilesystemName(int64_t magic);
bool IsNetworkFilesystem(int64_t magic);

// The cache's findings: its filesystem, its size against RAM (and how much
// of it is in the page cache now), and `verify --level quick`. Returns
// NotFound when DIR is not a directory; *ok = false when the cache cannot
// be opened or is damaged.
Status CacheFindings(const std::string& dir, const MemInfo& mem, std::vector<Finding>* out,
                     bool* ok);

struct GpuDevice {
  std::string name;
  uint64_t memory = 0;  // bytes
};
struct GpuProbe {
  std::string none_reason;  // why no GPU was found ("" when devices is non-empty)
  int driver_version = 0;   // cuDriverGetVersion: 1000 x major + 10 x minor
  std::vector<GpuDevice> devices;
  // Page-locked host memory (cuMemHostAlloc on device 0), tried only when
  // there is a device.
  bool pinned_tried = false;
  std::string pinned_error;  // "" when the allocation worked
};
// Loads `library` (the CUDA driver) and asks it for its devices; with a
// device, allocates and frees `pinned_bytes` of page-locked memory.
GpuProbe ProbeGpus(const std::string& library, uint64_t pinned_bytes);
// The "gpu" findings (one per device, or the one that says there is none)
// and the "pinned memory" one.
std::vector<Finding> GpuFindings(const GpuProbe& gpu, uint64_t pinned_bytes);

// Library name and version, for the libraries the kiln command was built
// with: LMDB and oneTBB here, the image codecs when kiln::image is built
// (doctor_codecs.cc; doctor_codecs_none.cc without it: CMake picks).
std::vector<std::pair<std::string, std::string>> LibraryVersions();
std::vector<std::pair<std::string, std::string>> CodecLibraryVersions();
Finding LibraryFinding();

}  // namespace kiln::tools

#endif  // KILN_TOOLS_DOCTOR_H_
