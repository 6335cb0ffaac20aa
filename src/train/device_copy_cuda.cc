// The CUDA DeviceCopier: host-to-device copies on a side stream, fenced with
// events; and the device's compute capability. Compiled only against a CUDA
// LibTorch (src/train/CMakeLists.txt).
//
// Per slot two events: `read` is recorded right after the copies, so the
// host slot may be refilled once it has passed; `ready` after the on-device
// conversion, so the consumer's stream waits for exactly its own batch. The
// device tensors are allocated on the side stream and record_stream()'d on
// the consumer's, so the caching allocator does not hand their memory out
// again before the consumer's kernels that read them have run.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <vector>

#include "device_copy.h"
#include "kiln/train/tensor_loader.h"

namespace kiln::train::internal {
namespace {

c10::DeviceIndex IndexOf(torch::Device device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

class CudaCopier final : public DeviceCopier {
 public:
  CudaCopier(torch::Device device, int slots)
      : device_(torch::kCUDA, IndexOf(device)),
        stream_(c10::cuda::getStreamFromPool(false, device_.index())),
        read_(slots),
        ready_(slots) {}

  void Start(int slot, const torch::Tensor& x, const torch::Tensor& y, const Convert& convert,
             torch::Tensor* dx, torch::Tensor* dy) override {
    c10::cuda::CUDAStreamGuard guard(stream_);
    *dx = x.to(device_, /*non_blocking=*/true);
    *dy = y.to(device_, /*non_blocking=*/true);
    read_[slot].record(stream_);
    *dx = convert(*dx);
    ready_[slot].record(stream_);
  }

  void HandOff(int slot, torch::Tensor* dx, torch::Tensor* dy) override {
    const c10::cuda::CUDAStream consumer = c10::cuda::getCurrentCUDAStream(device_.index());
    ready_[slot].block(consumer);
    if (consumer != stream_) {
      dx->record_stream(consumer);
      dy->record_stream(consumer);
    }
  }

  void WaitHostRead(int slot) override { read_[slot].synchronize(); }

  bool asynchronous() const override { return true; }

 private:
  torch::Device device_;
  c10::cuda::CUDAStream stream_;
  std::vector<at::cuda::CUDAEvent> read_, ready_;
};

}  // namespace

std::unique_ptr<DeviceCopier> MakeCudaCopier(torch::Device device, int slots) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaCopier>(device, slots);
}

bool CudaCapability(torch::Device device, int* major, int* minor) {
  if (!device.is_cuda()) return false;
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(IndexOf(device));
  *major = p->major;
  *minor = p->minor;
  return true;
}

}  // namespace kiln::train::internal

namespace kiln::train {

double PinnedHostToDeviceBandwidth(torch::Device device, int64_t bytes, int reps) {
  if (!device.is_cuda() || bytes <= 0 || reps <= 0) return 0.0;
  const torch::Device d(torch::kCUDA, internal::IndexOf(device));
  c10::cuda::CUDAGuard guard(d);
  const auto host = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  host.fill_(1);
  auto dev = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(d));
  dev.copy_(host, /*non_blocking=*/true);  // warm-up: the first copy sets things up
  c10::cuda::device_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) dev.copy_(host, /*non_blocking=*/true);
  c10::cuda::device_synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s > 0 ? static_cast<double>(bytes) * reps / s : 0.0;
}

bool BuiltWithCuda() { return true; }

Status NoCudaDevice(const std::string& option) {
  return Status::NotSupported(
      "no CUDA device: " + option +
      ": the CUDA LibTorch finds no GPU here (torch::cuda::is_available() is false: no "
      "NVIDIA driver or no device); use --device cpu");
}

}  // namespace kiln::train
