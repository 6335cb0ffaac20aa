// The CUDA pieces for a LibTorch without CUDA: there is no CUDA device to
// copy to, so TensorLoader uses the synchronous copier, and none to ask.
#include "device_copy.h"
#include "kiln/train/tensor_loader.h"

namespace kiln::train::internal {

std::unique_ptr<DeviceCopier> MakeCudaCopier(torch::Device, int) { return nullptr; }

bool CudaCapability(torch::Device, int*, int*) { return false; }

}  // namespace kiln::train::internal

namespace kiln::train {

double PinnedHostToDeviceBandwidth(torch::Device, int64_t, int) { return 0.0; }

bool BuiltWithCuda() { return false; }

Status NoCudaDevice(const std::string& option) {
  return Status::NotSupported(
      "no CUDA device: " + option +
      ": this kiln is built against a LibTorch without CUDA (Debian's libtorch-dev is "
      "CPU-only): build against a CUDA PyTorch with tools/setup.sh gpu");
}

}  // namespace kiln::train
