// kiln bench CACHE: loader throughput alone, against the memcpy floor for
// the same records in the same order, measured in the same run.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "command.h"
#include "core/memcpy_floor.h"
#include "kiln/cache_reader.h"
#include "kiln/loader.h"

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
  std::unique_ptr<Loader> loader;
  s = Loader::Open(reader.get(), o, slots, &loader);
  if (!s.ok()) return ReportError("bench", s);
  const uint64_t n = loader->samples_per_epoch();
  std::cout << "kiln bench " << a.dir << ": " << n << " samples of " << sample << " bytes, batch "
            << a.batch << ", " << a.workers << " workers, ring " << k << " slots (" << ring_mb
            << " MB), shuffled\n";
  double best_loader = 0;
  for (int e = 0; e < a.epochs; ++e) {
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
    std::printf("  epoch %d: %.0f samples/s, %.2f GB/s\n", e, seen / t, seen * sample / t / 1e9);
  }
  // The floor: memcpy of the same records, in epoch 0's order, into a ring
  // of the same size, with the same number of threads.
  double floor = 0;
  s = MeasureMemcpyFloor(reader.get(), loader->EpochOrder(0), a.batch, a.workers, buffers, 3,
                         &floor);
  if (!s.ok()) return ReportError("bench", s);
  std::printf("  memcpy floor (same records, same order, %d threads): %.0f samples/s, %.2f GB/s\n",
              a.workers, floor, floor * sample / 1e9);
  std::printf("  loader / floor = %.2f\n", floor > 0 ? best_loader / floor : 0.0);
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
