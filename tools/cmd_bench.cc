// kiln bench CACHE: loader throughput alone, against the memcpy floor for
// the same records in the same order, measured in the same run.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "command.h"
#include "core/disk_floor.h"
#include "core/memcpy_floor.h"
#include "core/page_cache.h"
#include "kiln/cache_reader.h"
#include "kiln/loader.h"
#include "core/units.h"

namespace kiln::tools {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

long RssAnonKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::strtol(line.c_str() + 8, nullptr, 10);
  return -1;
}

// The --readahead option as LoaderOptions::readahead_bytes.
Status ParseReadAhead(const std::string& text, uint64_t* out) {
  if (text == "auto") {
    *out = kAutoReadAhead;
    return Status::OK();
  }
  if (text == "0" || text == "off") {
    *out = 0;
    return Status::OK();
  }
  return ParseByteSize(text, "--readahead", out);
}

// The disk's floors of --cold, printed as they are measured; *best is the
// fastest random-read floor in samples/s, *sequential the sequential one.
Status MeasureDiskFloors(const CacheReader& reader, const std::vector<uint64_t>& order,
                         double* best, double* sequential) {
  DiskFloor f;
  KILN_RETURN_IF_ERROR(MeasureSequentialRead(reader, &f));
  *sequential = reader.size() / f.seconds;
  std::printf(
      "  disk floor, sequential read of the shards (1 thread, 8 MB reads): %.0f samples/s, "
      "%s/s\n",
      *sequential, FormatByteSize(f.bytes_per_s()).c_str());
  const uint64_t reads = std::min<uint64_t>(order.size(), 4000);
  *best = 0;
  for (int threads : {1, 2, 8, 32}) {
    KILN_RETURN_IF_ERROR(MeasureRandomReads(reader, order, threads, reads, &f));
    std::printf("  disk floor, random record reads, %2d threads: %.0f samples/s, %s/s\n", threads,
                f.reads_per_s(), FormatByteSize(f.bytes_per_s()).c_str());
    *best = std::max(*best, f.reads_per_s());
  }
  return Status::OK();
}

int RunBench(const BenchArgs& a) {
  // Another device needs LibTorch: kiln-train measures the copies there.
  if (a.device != "cpu")
    return ExecBeside("kiln-train", {"kiln", "bench", a.dir, "--batch", std::to_string(a.batch),
                                     "--workers", std::to_string(a.workers), "--epochs",
                                     std::to_string(a.epochs), "--device", a.device});
  std::unique_ptr<CacheReader> reader;
  Status s = CacheReader::Open(a.dir, ReaderOptions(), &reader);
  if (!s.ok()) return ReportError("bench", s);
  const uint64_t sample = reader->record_bytes();
  const int k = a.workers + 2;
  std::vector<void*> buffers;
  std::vector<std::vector<int64_t>> labels(k, std::vector<int64_t>(a.batch));
  std::vector<BatchSlot> slots;
  for (int i = 0; i < k; ++i) {
    void* p = std::aligned_alloc(64, (a.batch * sample + 63) / 64 * 64);
    std::memset(p, 0, a.batch * sample);  // fault the ring in before timing
    buffers.push_back(p);
    slots.push_back({p, labels[i].data()});
  }
  const double ring_mb = k * a.batch * sample / 1e6;
  LoaderOptions o;
  o.batch_size = a.batch;
  o.workers = a.workers;
  o.seed = 1;
  s = ParseReadAhead(a.readahead, &o.readahead_bytes);
  if (!s.ok()) return ReportError("bench", s);
  std::unique_ptr<Loader> loader;
  s = Loader::Open(reader.get(), o, slots, &loader);
  if (!s.ok()) return ReportError("bench", s);
  const uint64_t n = loader->samples_per_epoch();
  double resident = 0;
  s = ResidentFraction(*reader, &resident);
  if (!s.ok()) return ReportError("bench", s);
  std::cout << "kiln bench " << a.dir << ": " << n << " samples of " << sample << " bytes, batch "
            << a.batch << ", " << a.workers << " workers, ring " << k << " slots (" << ring_mb
            << " MB), shuffled, read-ahead "
            << (loader->readahead_bytes() ? FormatByteSize(loader->readahead_bytes()) : "off")
            << (a.cold ? ", cold: the cache is dropped from the page cache before each epoch" : "")
            << "\n";
  if (!a.cold) std::printf("  in the page cache before the first epoch: %.0f%%\n", 100 * resident);
  double best_loader = 0;
  for (int e = 0; e < a.epochs; ++e) {
    if (a.cold) {
      double left = 0;
      s = EvictFromPageCache(*reader, &left);
      if (!s.ok()) return ReportError("bench", s);
      if (left > 0.05)
        std::printf(
            "  warning: %.0f%% of the cache stays in memory after the eviction (another "
            "process maps it, or it is on tmpfs): this epoch is not cold\n",
            100 * left);
    }
    const auto t0 = std::chrono::steady_clock::now();
    s = loader->StartEpoch(e);
    uint64_t seen = 0;
    volatile int64_t sink = 0;
    while (s.ok()) {
      Batch b;
      s = loader->Next(&b);
      if (s.IsNotFound()) {
        s = Status::OK();
        break;
      }
      if (!s.ok()) break;
      sink = sink + labels[b.slot][0];
      seen += b.size;
      loader->Release(b.slot);
    }
    if (!s.ok()) return ReportError("bench", s);
    const double t = Seconds(t0);
    best_loader = std::max(best_loader, seen / t);
    std::printf("  epoch %d: %.0f samples/s, %.2f GB/s%s\n", e, seen / t, seen * sample / t / 1e9,
                a.cold ? " (cold)" : "");
  }
  if (a.cold) {
    // The disk's floors for the same records, measured now, each from a
    // cold page cache.
    double best_random = 0, sequential = 0;
    s = MeasureDiskFloors(*reader, loader->EpochOrder(0), &best_random, &sequential);
    if (!s.ok()) return ReportError("bench", s);
    std::printf("  loader / best random-read floor = %.2f\n",
                best_random > 0 ? best_loader / best_random : 0.0);
    std::printf("  loader / sequential-read floor = %.2f\n",
                sequential > 0 ? best_loader / sequential : 0.0);
  } else {
    // The floor: memcpy of the same records, in epoch 0's order, into a
    // ring of the same size, with the same number of threads. It is the
    // memory's floor only when the cache is in memory.
    double floor = 0;
    s = MeasureMemcpyFloor(reader.get(), loader->EpochOrder(0), a.batch, a.workers, buffers, 3,
                           &floor);
    if (!s.ok()) return ReportError("bench", s);
    std::printf(
        "  memcpy floor (same records, same order, %d threads): %.0f samples/s, %.2f GB/s\n",
        a.workers, floor, floor * sample / 1e9);
    if (resident < 0.99)
      std::printf(
          "  note: %.0f%% of the cache was in memory when this began, so the memcpy "
          "figure includes reading the rest from the disk and is not a floor: measure "
          "with --cold against the disk's floors\n",
          100 * resident);
    std::printf("  loader / floor = %.2f\n", floor > 0 ? best_loader / floor : 0.0);
  }
  const long rss = RssAnonKb();
  // /proc reports kB = KiB; MB here are 10^6 bytes, as for the ring.
  const double rss_mb = rss * 1024.0 / 1e6;
  std::printf("  RssAnon %.1f MB (ring %.1f MB): %.1f MB beyond the ring\n", rss_mb, ring_mb,
              rss_mb - ring_mb);
  loader.reset();
  for (void* p : buffers) std::free(p);
  return kExitOk;
}

KILN_COMMAND(Command{"bench", "Measure loader throughput against the memcpy floor", 40,
                     [](CLI::App* sub) -> std::function<int()> {
                       auto a = std::make_shared<BenchArgs>();
                       AddBenchOptions(sub, a.get());
                       return [a] { return RunBench(*a); };
                     }});

}  // namespace
}  // namespace kiln::tools
