// kiln bench CACHE --device cuda (run by `kiln bench` in kiln-train, the
// executable that loads LibTorch): the TensorLoader's throughput onto the
// training device, host-to-device copies included, against the floors
// measured in the same run: the memcpy of the same records in the same
// order, and the pinned host-to-device bandwidth for the same bytes.
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>

#include "command.h"
#include "core/memcpy_floor.h"
#include "kiln/train/tensor_loader.h"

namespace kiln::tools {
namespace {

torch::ScalarType TrainingType(DType d, const torch::Device& device) {
  // Float caches are delivered as stored; a uint8 cache is normalized on the
  // device, to float16 on a GPU as kiln train does with mixed precision, to
  // float32 on the CPU (where float16 arithmetic is slow).
  if (d == DType::kFloat32) return torch::kFloat32;
  if (d == DType::kFloat16) return torch::kFloat16;
  return device.is_cuda() ? torch::kFloat16 : torch::kFloat32;
}

int RunDeviceBench(const BenchArgs& a) {
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(a.device);
  } catch (const std::exception&) {
    return ReportError("bench", Status::InvalidArgument("--device " + a.device +
                                                        ": expected cpu, cuda or cuda:N"));
  }
  if (Status no = train::CheckCudaDevice(device, "--device " + a.device); !no.ok())
    return ReportError("bench", no);
  std::unique_ptr<CacheReader> reader;
  Status s = CacheReader::Open(a.dir, ReaderOptions(), &reader);
  if (!s.ok()) return ReportError("bench", s);
  const uint64_t sample = reader->record_bytes();
  train::TensorLoaderOptions o;
  o.loader.batch_size = a.batch;
  o.loader.workers = a.workers;
  o.loader.seed = 1;
  o.slots = a.workers + 2;
  o.device = device;
  o.dtype = TrainingType(reader->manifest().dtype, device);
  std::unique_ptr<train::TensorLoader> tl;
  s = train::TensorLoader::Open(reader.get(), o, &tl);
  if (!s.ok()) return ReportError("bench", s);
  const uint64_t n = tl->loader().samples_per_epoch();
  std::printf("kiln bench %s --device %s: %llu samples of %llu bytes, batch %llu, %d workers, "
              "ring %d slots%s, %s copies, shuffled\n",
              a.dir.c_str(), device.str().c_str(), static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(sample), static_cast<unsigned long long>(a.batch),
              a.workers, o.slots, tl->slot_tensors()[0].is_pinned() ? " (pinned)" : "",
              tl->asynchronous() ? "asynchronous side-stream" : "synchronous");
  double best = 0;
  for (int e = 0; e < a.epochs; ++e) {
    const auto t0 = std::chrono::steady_clock::now();
    s = tl->StartEpoch(e);
    uint64_t seen = 0;
    torch::Tensor x, y;
    while (s.ok()) {
      s = tl->Next(&x, &y);
      if (s.IsNotFound()) {
        s = Status::OK();
        break;
      }
      if (s.ok()) seen += static_cast<uint64_t>(x.size(0));
    }
    if (!s.ok()) return ReportError("bench", s);
    if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, seen / t);
    std::printf("  epoch %d: %.0f samples/s, %.2f GB/s onto %s\n", e, seen / t,
                seen * sample / t / 1e9, device.str().c_str());
  }
  // Into the loader's own (pinned) slots, which it no longer uses.
  std::vector<void*> ring;
  for (const torch::Tensor& t : tl->slot_tensors()) ring.push_back(t.data_ptr());
  double memcpy_floor = 0;
  s = MeasureMemcpyFloor(reader.get(), tl->loader().EpochOrder(0), a.batch, a.workers, ring, 3,
                         &memcpy_floor);
  if (!s.ok()) return ReportError("bench", s);
  std::printf("  memcpy floor (same records, same order, %d threads): %.0f samples/s, %.2f GB/s\n",
              a.workers, memcpy_floor, memcpy_floor * sample / 1e9);
  double floor = memcpy_floor;
  if (device.is_cuda()) {
    const double bw = train::PinnedHostToDeviceBandwidth(
        device, static_cast<int64_t>(a.batch * sample), 20);
    const double h2d = sample > 0 ? bw / sample : 0;
    std::printf("  pinned host-to-device floor (%s per copy): %.0f samples/s, %.2f GB/s\n",
                HumanBytes(static_cast<double>(a.batch * sample)).c_str(), h2d, bw / 1e9);
    if (h2d > 0) floor = std::min(floor, h2d);
  }
  std::printf("  loader / floor = %.2f (floor: the slower of the floors above)\n",
              floor > 0 ? best / floor : 0.0);
  return kExitOk;
}

KILN_COMMAND(Command{"bench", "Measure loader throughput onto a device (cpu, cuda) against its floors", 40,
                     [](CLI::App* sub) -> std::function<int()> {
                       auto a = std::make_shared<BenchArgs>();
                       AddBenchOptions(sub, a.get());
                       return [a] { return RunDeviceBench(*a); };
                     }});

}  // namespace
}  // namespace kiln::tools
