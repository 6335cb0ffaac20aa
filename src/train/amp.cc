#include "kiln/train/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <map>

#include "core/cpus.h"
#include "device_copy.h"

// LibTorch 2.4 replaced the per-device autocast setters with ones that take
// a DeviceType; 1.13 has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define KILN_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define KILN_AUTOCAST_BY_DEVICE_TYPE 0
#endif
// The fused loss-scaling ops have CPU kernels from LibTorch 2.3 on (CUDA
// ones in every version kiln builds against).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define KILN_AMP_OPS_ON_CPU 1
#else
#define KILN_AMP_OPS_ON_CPU 0
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
    int major = 0, minor = 0;
    if (internal::CudaCapability(device, &major, &minor)) {
      *out = GpuAutoPrecision(major, minor, why);
    } else {
      *out = Precision::kFp16;
      if (why) *why = "auto: the GPU's compute capability is unknown";
    }
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

Precision GpuAutoPrecision(int major, int minor, std::string* why) {
  const bool native = major >= 8;
  if (why)
    *why =
        "auto: compute capability " + std::to_string(major) + "." + std::to_string(minor) +
        (native ? " computes bf16 natively"
                : " emulates bf16 slowly, so fp16 with loss scaling; --precision bf16 forces it");
  return native ? Precision::kBf16 : Precision::kFp16;
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
    : opt_(options), fused_(options.device.is_cuda() || KILN_AMP_OPS_ON_CPU) {
  const auto on = torch::TensorOptions().device(opt_.device);
  scale_ = torch::full({}, opt_.enabled ? opt_.init_scale : 1.0, on.dtype(torch::kFloat));
  tracker_ = torch::zeros({}, on.dtype(torch::kInt));
  found_ = torch::zeros({1}, on.dtype(torch::kFloat));
}

torch::Tensor LossScaler::Scale(const torch::Tensor& loss) const {
  return opt_.enabled ? loss * scale_ : loss;
}

double LossScaler::scale() const { return scale_.item<double>(); }
int64_t LossScaler::growth_tracker() const { return tracker_.item<int64_t>(); }

bool LossScaler::UnscaleAndCheck(const std::vector<torch::Tensor>& params) {
  if (!opt_.enabled) return true;
  torch::NoGradGuard no_grad;
  found_.zero_();
  if (fused_) {
    // GradScaler's inverse: computed in double, used as float.
    const torch::Tensor inv = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
    std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;  // the op takes one dtype
    for (const auto& p : params)
      if (p.grad().defined()) by_dtype[p.grad().scalar_type()].push_back(p.grad());
    for (auto& [dtype, grads] : by_dtype)
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_, inv);
  } else {
    const double inv = 1.0 / scale();
    for (const auto& p : params) {
      torch::Tensor g = p.grad();
      if (!g.defined()) continue;
      g.mul_(inv);
      found_.add_(g.isfinite().logical_not().any());
    }
  }
  return found_.item<float>() == 0;
}

void LossScaler::Update(bool found_inf) {
  if (!opt_.enabled) return;
  if (found_inf) ++skipped_;
  torch::NoGradGuard no_grad;
  if (fused_) {
    found_.fill_(found_inf ? 1.0 : 0.0);
    at::_amp_update_scale_(scale_, tracker_, found_, opt_.growth_factor, opt_.backoff_factor,
                           opt_.growth_interval);
    return;
  }
  double s = scale();
  int64_t t = growth_tracker();
  if (found_inf) {
    s *= opt_.backoff_factor;
    t = 0;
  } else if (++t >= opt_.growth_interval) {
    s *= opt_.growth_factor;
    t = 0;
  }
  scale_.fill_(s);
  tracker_.fill_(t);
}

void LossScaler::Restore(double scale, int64_t growth_tracker, int64_t skipped) {
  torch::NoGradGuard no_grad;
  scale_.fill_(scale);
  tracker_.fill_(growth_tracker);
  skipped_ = skipped;
}

}  // namespace kiln::train
