#include "kiln/train/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "core/cpus.h"

// LibTorch 2.4 replaced the per-device autocast setters with ones that take
// a DeviceType; 1.13 has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define KILN_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define KILN_AUTOCAST_BY_DEVICE_TYPE 0
#endif

namespace kiln::train {

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

Status ResolvePrecision(PrecisionChoice choice, const torch::Device& device, Precision* out,
                        std::string* why) {
  if (why) why->clear();
  if (choice == PrecisionChoice::kFp32) {
    *out = Precision::kFp32;
  } else if (choice == PrecisionChoice::kBf16) {
    *out = Precision::kBf16;
  } else if (choice == PrecisionChoice::kFp16) {
    *out = Precision::kFp16;
    if (device.is_cpu() && !KILN_AUTOCAST_BY_DEVICE_TYPE)
      return Status::NotSupported(
          "--precision fp16 on the CPU needs LibTorch >= 2.4 (this one is " TORCH_VERSION
          "); use --precision bf16 or fp32");
  } else if (device.is_cuda()) {  // kAuto
    *out = Precision::kFp16;
    try {
      auto a = torch::ones({16, 16}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
      (void)a.matmul(a).sum().item<float>();
      *out = Precision::kBf16;
    } catch (const c10::Error&) {
    }
    if (why) *why = *out == Precision::kBf16 ? "auto: the GPU runs bf16" : "auto: no bf16 on the GPU";
  } else {  // kAuto on the CPU
    const bool native = CpuHasNativeBf16();
    *out = native ? Precision::kBf16 : Precision::kFp32;
    if (why)
      *why = native ? "auto: this CPU computes bf16 natively, with AVX512-BF16 or AMX; "
                      "--precision fp32 for full precision"
                    : "auto: this CPU has no native bf16";
  }
  return Status::OK();
}

AutocastGuard::AutocastGuard(const torch::Device& device, Precision precision) {
  if (precision == Precision::kFp32) return;
  const at::ScalarType dtype = precision == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
  cuda_ = device.is_cuda();
#if KILN_AUTOCAST_BY_DEVICE_TYPE
  const c10::DeviceType type = cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  prev_enabled_ = at::autocast::is_autocast_enabled(type);
  prev_dtype_ = at::autocast::get_autocast_dtype(type);
  at::autocast::set_autocast_enabled(type, true);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (cuda_) {
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    prev_enabled_ = at::autocast::is_cpu_enabled();
    prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if KILN_AUTOCAST_BY_DEVICE_TYPE
  const c10::DeviceType type = cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  at::autocast::set_autocast_enabled(type, prev_enabled_);
  at::autocast::set_autocast_dtype(type, prev_dtype_);
#else
  if (cuda_) {
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
  } else {
    at::autocast::set_cpu_enabled(prev_enabled_);
    at::autocast::set_autocast_cpu_dtype(prev_dtype_);
  }
#endif
}

LossScaler::LossScaler(LossScalerOptions options)
    : opt_(options), scale_(options.enabled ? options.init_scale : 1.0) {}

torch::Tensor LossScaler::Scale(const torch::Tensor& loss) const {
  return opt_.enabled ? loss * scale_ : loss;
}

bool LossScaler::UnscaleAndCheck(const std::vector<torch::Tensor>& params) {
  if (!opt_.enabled) return true;
  const double inv = 1.0 / scale_;
  torch::Tensor bad;
  for (const auto& p : params) {
    torch::Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(inv);
    torch::Tensor b = g.isfinite().logical_not().any();
    bad = bad.defined() ? bad.logical_or(b) : b;
  }
  return !(bad.defined() && bad.item<bool>());
}

void LossScaler::Update(bool found_inf) {
  if (!opt_.enabled) return;
  if (found_inf) {
    scale_ *= opt_.backoff_factor;
    tracker_ = 0;
    ++skipped_;
  } else if (++tracker_ >= opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    tracker_ = 0;
  }
}

void LossScaler::Restore(double scale, int64_t growth_tracker, int64_t skipped) {
  scale_ = scale;
  tracker_ = growth_tracker;
  skipped_ = skipped;
}

}  // namespace kiln::train
