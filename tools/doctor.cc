#include "doctor.h"

#include "core/page_cache.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <lmdb.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/version.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "core/cpus.h"
#include "kiln/cache_reader.h"
#include "core/units.h"
#include "kiln/verify.h"

namespace kiln::tools {

const char* FindingLevelName(FindingLevel level) {
  switch (level) {
    case FindingLevel::kOk:
      return "ok";
    case FindingLevel::kInfo:
      return "info";
    case FindingLevel::kWarn:
      return "warn";
  }
  return "?";
}

std::string FormatFinding(const Finding& f) {
  char level[8];
  std::snprintf(level, sizeof(level), "%-5s", FindingLevelName(f.level));
  return std::string(level) + " " + f.topic + ": " + f.text;
}

namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Bytes(uint64_t bytes) { return FormatByteSize(static_cast<double>(bytes)); }

}  // namespace

// ---- CPUs

CpuFacts ProbeCpus(const std::string& cgroup_cpu_max) {
  CpuFacts c;
  c.usable = UsableCpus();
  c.online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::istringstream in(ReadText(cgroup_cpu_max));
  std::string quota;
  double period = 0;
  if (in >> quota >> period && quota != "max" && period > 0)
    c.quota = std::strtod(quota.c_str(), nullptr) / period;
  c.pool_threads = tbb::this_task_arena::max_concurrency();
  // As kiln::train::DefaultCpuThreads: the usable CPUs shared by the ranks on this host.
  int ranks = 1;
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) ranks = std::max(1, std::atoi(local));
  c.train_threads = std::max(1, c.usable / ranks);
  c.native_bf16 = CpuHasNativeBf16();
  return c;
}

Finding CpuFinding(const CpuFacts& c) {
  Finding f{FindingLevel::kOk, "cpu", ""};
  f.text = std::to_string(c.usable) + " usable core" + (c.usable == 1 ? "" : "s") +
           " (sched_getaffinity) of " + std::to_string(c.online) + " online; kiln build and " +
           "verify use " + std::to_string(c.pool_threads) + " threads, kiln train " +
           std::to_string(c.train_threads) +
           " intra-op threads, the loader 2 workers (--workers); " +
           (c.native_bf16 ? "native bf16 (AVX512-BF16/AMX): kiln train on the CPU trains in bf16 "
                            "(--precision auto), about twice fp32's speed"
                          : "no native bf16: kiln train on the CPU trains in fp32");
  if (c.quota > 0 && c.quota + 0.5 < c.pool_threads) {
    char q[32];
    std::snprintf(q, sizeof(q), "%.1f", c.quota);
    const int n = std::max(1, static_cast<int>(std::floor(c.quota)));
    f.level = FindingLevel::kWarn;
    f.text += "; but the cgroup's CPU quota allows only " + std::string(q) +
              " CPUs of time: pass --threads " + std::to_string(n) +
              " to kiln build, verify and train so that their threads do not queue";
  } else if (c.usable == 1) {
    f.level = FindingLevel::kWarn;
    f.text +=
        "; with one core the loader and the model take turns: give this process more "
        "CPUs (taskset, --cpuset-cpus) to overlap them";
  }
  f.text += ".";
  return f;
}

// ---- Memory

Status ParseMemInfo(const std::string& text, MemInfo* out) {
  *out = MemInfo();
  bool total = false, available = false;
  std::istringstream in(text);
  std::string key, unit;
  uint64_t kib = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> kib)) continue;
    if (key == "MemTotal:") out->total = kib * 1024, total = true;
    if (key == "MemAvailable:") out->available = kib * 1024, available = true;
  }
  if (!total || !available)
    return Status::Corruption("meminfo: no MemTotal and MemAvailable lines");
  return Status::OK();
}

Finding MemoryFinding(const MemInfo& m) {
  Finding f{FindingLevel::kOk, "memory", ""};
  f.text = Bytes(m.total) + " RAM, " + Bytes(m.available) + " available (/proc/meminfo)";
  if (m.available * 10 < m.total) {
    f.level = FindingLevel::kWarn;
    f.text +=
        ": under a tenth is free, so caches are read from disk and large batches may not "
        "fit; stop what holds the memory, or train with a smaller --batch-size.";
  } else {
    f.text += "; compare with a cache's size: kiln doctor CACHE.";
  }
  return f;
}

// ---- Filesystems

namespace {
struct FsName {
  int64_t magic;
  const char* name;
  bool network;
};
// From linux/magic.h and the filesystems' own sources (not all are in that header).
constexpr FsName kFilesystems[] = {
    {0xEF53, "ext2/ext3/ext4", false},
    {0x58465342, "xfs", false},
    {0x9123683E, "btrfs", false},
    {0x2FC12FC1, "zfs", false},
    {0x01021994, "tmpfs", false},
    {0x858458F6, "ramfs", false},
    {0x794C7630, "overlayfs", false},
    {0x73717368, "squashfs", false},
    {0x4D44, "vfat", false},
    {0x2011BAB0, "exfat", false},
    {0x5346544E, "ntfs", false},
    {0xF2F52010, "f2fs", false},
    {0x6969, "nfs", true},
    {0xFF534D42, "cifs", true},
    {0xFE534D42, "smb2", true},
    {0x65735546, "fuse", true},
    {0x01021997, "9p", true},
    {0x0BD00BD0, "lustre", true},
    {0x00C36400, "ceph", true},
    {0x47504653, "gpfs", true},
    {0x19830326, "beegfs", true},
};
}  // namespace

std::string FilesystemName(int64_t magic) {
  for (const FsName& fs : kFilesystems)
    if (fs.magic == magic) return fs.name;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "unknown (0x%llx)", static_cast<unsigned long long>(magic));
  return buf;
}

bool IsNetworkFilesystem(int64_t magic) {
  for (const FsName& fs : kFilesystems)
    if (fs.magic == magic) return fs.network;
  return false;
}

// ---- The cache

namespace {

// Bytes of `path` now in the page cache (mincore over a read-only map).
uint64_t ResidentBytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st = {};
  uint64_t resident = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const size_t size = static_cast<size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> in_core((size + page - 1) / page);
      if (::mincore(map, size, in_core.data()) == 0)
        for (unsigned char c : in_core) resident += (c & 1) ? page : 0;
      ::munmap(map, size);
    }
  }
  ::close(fd);
  return std::min<uint64_t>(resident, static_cast<uint64_t>(st.st_size));
}

}  // namespace

Status CacheFindings(const std::string& dir, const MemInfo& mem, std::vector<Finding>* out,
                     bool* ok) {
  *ok = true;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return Status::NotFound(dir + ": no such cache directory");

  struct statfs sfs;
  if (::statfs(dir.c_str(), &sfs) == 0) {
    const int64_t magic = static_cast<int64_t>(sfs.f_type);
    Finding f{FindingLevel::kOk, "filesystem", dir + " is on " + FilesystemName(magic)};
    if (IsNetworkFilesystem(magic)) {
      f.level = FindingLevel::kWarn;
      f.text += ", whose reads go over the network: copy the cache to a local disk for training.";
    } else if (magic == 0x01021994 || magic == 0x858458F6) {
      f.text += ", in RAM: reads are as fast as they get (it is lost at reboot).";
    } else if (magic == 0x794C7630) {
      f.level = FindingLevel::kInfo;
      f.text +=
          " (a container's layers): mount the cache's directory as a volume so that reads "
          "do not go through the overlay.";
    } else {
      f.text += ", a local filesystem.";
    }
    out->push_back(f);
  }

  std::unique_ptr<CacheReader> reader;
  ReaderOptions ro;
  ro.allow_part = true;
  Status s = CacheReader::Open(dir, ro, &reader);
  if (!s.ok()) {
    *ok = false;
    out->push_back({FindingLevel::kWarn, "cache",
                    "cannot be opened (" + s.ToString() +
                        "): run kiln verify on it, then rebuild it with kiln build --force."});
    return Status::OK();
  }
  const Manifest& m = reader->manifest();
  uint64_t bytes = 0, resident = 0;
  for (const ShardInfo& sh : m.shards) {
    bytes += sh.bytes;
    resident += ResidentBytes((std::filesystem::path(dir) / sh.file).string());
  }
  Finding size{FindingLevel::kOk, "cache size", ""};
  const int cached = bytes ? static_cast<int>(100.0 * resident / bytes + 0.5) : 100;
  size.text = Bytes(bytes) + " (" + std::to_string(m.count) + " records of " +
              Bytes(reader->record_bytes()) + "), " + std::to_string(cached) +
              "% in the page cache now; ";
  const std::string usable =
      Bytes(mem.usable()) + (mem.usable() < mem.available ? " the memory cgroup allows" : " of available RAM");
  // Without the page cache an epoch reads the whole cache from the disk: the
  // loader reads ahead, so the disk's speed sets the epoch's time.
  const std::string every_epoch =
      "every epoch reads all " + Bytes(bytes) +
      " from the disk and takes at least that over the disk's speed (kiln bench " + dir +
      " --cold measures it)";
  if (mem.total == 0) {
    size.level = FindingLevel::kInfo;
    size.text += "RAM unknown, so whether it fits in the page cache is too.";
  } else if (bytes <= mem.usable()) {
    size.text += "it fits in the " + usable + ", so epochs after the first read it from memory.";
  } else if (bytes <= mem.total && (mem.cgroup_limit == 0 || bytes <= mem.cgroup_limit)) {
    size.level = FindingLevel::kWarn;
    size.text += "it fits in RAM (" + Bytes(mem.total) + ") but not in the " + usable +
                 ": free memory, or " + every_epoch + ".";
  } else {
    size.level = FindingLevel::kWarn;
    size.text += "larger than " +
                 (mem.cgroup_limit && mem.cgroup_limit < mem.total
                      ? "the memory cgroup's limit (" + Bytes(mem.cgroup_limit) + ")"
                      : "RAM (" + Bytes(mem.total) + ")") +
                 ": " + every_epoch +
                 "; rebuild with a smaller --dtype (float16, uint8) or --resize, or keep it on the "
                 "fastest disk.";
  }
  out->push_back(size);

  VerifyOptions vo;
  vo.level = VerifyLevel::kQuick;
  VerifyReport report;
  const auto t0 = std::chrono::steady_clock::now();
  s = VerifyCache(dir, vo, &report);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char took[32];
  std::snprintf(took, sizeof(took), "%.2f s", seconds);
  Finding verify{FindingLevel::kOk, "cache verify", ""};
  if (!s.ok()) {
    *ok = false;
    verify.level = FindingLevel::kWarn;
    verify.text = "verify --level quick could not run (" + s.ToString() +
                  "): check the directory's permissions.";
  } else if (!report.clean()) {
    *ok = false;
    verify.level = FindingLevel::kWarn;
    verify.text = "verify --level quick found " + std::to_string(report.problems.size()) +
                  " problem(s), the first: " + report.problems.front().what +
                  "; see kiln verify, then kiln build --repair or --force.";
  } else {
    verify.text = "verify --level quick: clean, " + std::to_string(report.records_checked) +
                  " records in " + took +
                  "; kiln verify (full) recomputes every checksum when in doubt.";
  }
  out->push_back(verify);
  return Status::OK();
}

// ---- GPUs, through the CUDA driver API

namespace {

// The driver API's C types, as cuda.h declares them: CUresult is an enum
// (an int), CUdevice an int, CUcontext an opaque pointer.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;

class CudaDriver {
 public:
  explicit CudaDriver(const std::string& library)
      : handle_(::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) {
      const char* e = ::dlerror();
      error_ = e ? e : ("cannot load " + library);
    }
  }
  ~CudaDriver() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }

  // The function `name` (the first of `names` the library has), or null.
  template <typename Fn>
  Fn* Get(std::initializer_list<const char*> names) const {
    for (const char* name : names)
      if (void* p = ::dlsym(handle_, name)) return reinterpret_cast<Fn*>(p);
    return nullptr;
  }

  // "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
  std::string Error(const char* call, CUresult r) const {
    std::string text = std::string(call) + ": error " + std::to_string(r);
    auto* name = Get<CUresult(CUresult, const char**)>({"cuGetErrorName"});
    auto* what = Get<CUresult(CUresult, const char**)>({"cuGetErrorString"});
    const char* n = nullptr;
    const char* w = nullptr;
    if (name != nullptr && name(r, &n) == 0 && n != nullptr) text = std::string(call) + ": " + n;
    if (what != nullptr && what(r, &w) == 0 && w != nullptr) text += std::string(" (") + w + ")";
    return text;
  }

 private:
  void* handle_;
  std::string error_;
};

std::string PinnedTry(const CudaDriver& cu, CUdevice dev, uint64_t bytes) {
  auto* retain = cu.Get<CUresult(CUcontext*, CUdevice)>({"cuDevicePrimaryCtxRetain"});
  auto* release =
      cu.Get<CUresult(CUdevice)>({"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"});
  auto* set_current = cu.Get<CUresult(CUcontext)>({"cuCtxSetCurrent"});
  auto* alloc = cu.Get<CUresult(void**, size_t, unsigned)>({"cuMemHostAlloc"});
  auto* free_host = cu.Get<CUresult(void*)>({"cuMemFreeHost"});
  if (!retain || !release || !set_current || !alloc || !free_host)
    return "the driver lacks cuDevicePrimaryCtxRetain, cuCtxSetCurrent or cuMemHostAlloc";
  CUcontext ctx = nullptr;
  CUresult r = retain(&ctx, dev);
  if (r != 0) return cu.Error("cuDevicePrimaryCtxRetain", r);
  std::string error;
  r = set_current(ctx);
  if (r != 0) {
    error = cu.Error("cuCtxSetCurrent", r);
  } else {
    void* p = nullptr;
    r = alloc(&p, static_cast<size_t>(bytes), 0);
    if (r != 0)
      error = cu.Error("cuMemHostAlloc", r);
    else
      free_host(p);
    set_current(nullptr);
  }
  release(dev);
  return error;
}

}  // namespace

GpuProbe ProbeGpus(const std::string& library, uint64_t pinned_bytes) {
  GpuProbe g;
  CudaDriver cu(library);
  if (!cu.loaded()) {
    g.none_reason = "no CUDA driver: " + cu.error();
    return g;
  }
  auto* init = cu.Get<CUresult(unsigned)>({"cuInit"});
  auto* count = cu.Get<CUresult(int*)>({"cuDeviceGetCount"});
  auto* get = cu.Get<CUresult(CUdevice*, int)>({"cuDeviceGet"});
  auto* name = cu.Get<CUresult(char*, int, CUdevice)>({"cuDeviceGetName"});
  auto* total = cu.Get<CUresult(size_t*, CUdevice)>({"cuDeviceTotalMem_v2", "cuDeviceTotalMem"});
  auto* version = cu.Get<CUresult(int*)>({"cuDriverGetVersion"});
  if (!init || !count || !get || !name || !total) {
    g.none_reason = library + " lacks the driver API's device functions";
    return g;
  }
  CUresult r = init(0);
  if (r != 0) {
    g.none_reason = cu.Error("cuInit", r);
    return g;
  }
  if (version != nullptr) version(&g.driver_version);
  int n = 0;
  r = count(&n);
  if (r != 0) {
    g.none_reason = cu.Error("cuDeviceGetCount", r);
    return g;
  }
  for (int i = 0; i < n; ++i) {
    CUdevice dev = 0;
    char buf[256] = {0};
    size_t bytes = 0;
    GpuDevice d;
    if (get(&dev, i) == 0 && name(buf, sizeof(buf) - 1, dev) == 0) d.name = buf;
    if (total(&bytes, dev) == 0) d.memory = bytes;
    g.devices.push_back(d);
  }
  if (g.devices.empty()) {
    g.none_reason = "the CUDA driver sees no device";
    return g;
  }
  CUdevice dev0 = 0;
  if (get(&dev0, 0) == 0) {
    g.pinned_tried = true;
    g.pinned_error = PinnedTry(cu, dev0, pinned_bytes);
  }
  return g;
}

std::vector<Finding> GpuFindings(const GpuProbe& g, uint64_t pinned_bytes) {
  std::vector<Finding> out;
  if (g.devices.empty()) {
    out.push_back({FindingLevel::kWarn, "gpu",
                   "no GPU found: kiln train will run on the CPU; on a machine with an NVIDIA "
                   "GPU, install its driver to train there (" +
                       g.none_reason + ")."});
    out.push_back({FindingLevel::kInfo, "pinned memory", "not applicable without a GPU."});
    return out;
  }
  const std::string driver = g.driver_version
                                 ? "CUDA driver " + std::to_string(g.driver_version / 1000) + "." +
                                       std::to_string(g.driver_version % 1000 / 10)
                                 : "CUDA driver";
  for (size_t i = 0; i < g.devices.size(); ++i)
    out.push_back({FindingLevel::kOk, "gpu " + std::to_string(i),
                   (g.devices[i].name.empty() ? "(unnamed)" : g.devices[i].name) + ", " +
                       Bytes(g.devices[i].memory) + " (" + driver +
                       "): kiln train --device cuda:" + std::to_string(i) + " trains on it."});
  if (!g.pinned_tried) {
    out.push_back({FindingLevel::kInfo, "pinned memory", "not tried: device 0 was not usable."});
  } else if (g.pinned_error.empty()) {
    out.push_back({FindingLevel::kOk, "pinned memory",
                   Bytes(pinned_bytes) + " of page-locked host memory allocated (cuMemHostAlloc): "
                                         "batches reach the GPU by asynchronous copies."});
  } else {
    out.push_back({FindingLevel::kWarn, "pinned memory",
                   "page-locked host memory failed (" + g.pinned_error +
                       "): copies to the GPU will be synchronous; check the driver (nvidia-smi) "
                       "and free host memory."});
  }
  return out;
}

// ---- Libraries

std::vector<std::pair<std::string, std::string>> LibraryVersions() {
  std::vector<std::pair<std::string, std::string>> v;
  int major = 0, minor = 0, patch = 0;
  mdb_version(&major, &minor, &patch);
  v.push_back(
      {"LMDB", std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch)});
  v.push_back(
      {"oneTBB", std::string(TBB_VERSION_STRING) + " (runtime " + TBB_runtime_version() + ")"});
  for (const auto& codec : CodecLibraryVersions()) v.push_back(codec);
  return v;
}

Finding LibraryFinding() {
  Finding f{FindingLevel::kInfo, "libraries", ""};
  for (const auto& [name, version] : LibraryVersions())
    f.text += (f.text.empty() ? "" : ", ") + name + " " + version;
  f.text += "; kiln train's LibTorch is kiln-train's (not loaded here).";
  return f;
}

// ---- All of it

namespace {

// --device cuda[:N]: the device must be there.
Status RequireDevice(const std::string& device, const GpuProbe& gpu) {
  const std::string option = "--device " + device;
  if (device == "cpu") return Status::OK();
  const std::string n = device.size() > 5 ? device.substr(5) : "";
  if (device.rfind("cuda", 0) != 0 || (device.size() > 4 && device[4] != ':') ||
      (device.size() > 4 && (n.empty() || n.size() > 4 ||
                             n.find_first_not_of("0123456789") != std::string::npos)))
    return Status::InvalidArgument(option + ": expected cpu, cuda or cuda:N");
  const size_t index = n.empty() ? 0 : std::stoul(n);
  if (gpu.devices.empty()) return Status::NotSupported("no CUDA device: " + option + ": " + gpu.none_reason);
  if (index >= gpu.devices.size())
    return Status::NotSupported("no CUDA device: " + option + ": the CUDA driver sees " +
                                std::to_string(gpu.devices.size()) + " device(s)");
  return Status::OK();
}

}  // namespace

Status RunDoctor(const DoctorOptions& o, std::vector<Finding>* findings, bool* cache_ok) {
  *cache_ok = true;
  const GpuProbe gpu = ProbeGpus(o.cuda_library, o.pinned_bytes);
  if (!o.device.empty()) KILN_RETURN_IF_ERROR(RequireDevice(o.device, gpu));
  findings->push_back(CpuFinding(ProbeCpus(o.cgroup_cpu_max)));
  MemInfo mem;
  if (ParseMemInfo(ReadText(o.meminfo), &mem).ok()) {
    if (o.meminfo == "/proc/meminfo") mem.cgroup_limit = CgroupMemoryLimit();
    findings->push_back(MemoryFinding(mem));
  }
  else
    findings->push_back(
        {FindingLevel::kInfo, "memory", o.meminfo + " is unreadable: RAM unknown."});
  if (!o.cache.empty()) KILN_RETURN_IF_ERROR(CacheFindings(o.cache, mem, findings, cache_ok));
  for (Finding& f : GpuFindings(gpu, o.pinned_bytes))
    findings->push_back(std::move(f));
  findings->push_back(LibraryFinding());
  return Status::OK();
}

}  // namespace kiln::tools
