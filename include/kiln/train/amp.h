// Mixed precision for kiln train: an autocast scope that compiles against
// LibTorch 1.13 and 2.x, and a dynamic loss scaler with PyTorch's
// GradScaler semantics (no C++ GradScaler exists in either version).
//
// Thread-safety: autocast state is thread-local; open the scope on the
// thread that runs forward. A LossScaler is used from one thread.
#ifndef KILN_TRAIN_AMP_H_
#define KILN_TRAIN_AMP_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

enum class Precision { kFp32, kBf16, kFp16 };
const char* PrecisionName(Precision p);

// The precision `choice` means on `device`. kAuto: on a GPU what
// GpuAutoPrecision says for its compute capability; on the CPU bf16 where the CPU
// computes bf16 natively (AVX512-BF16 or AMX: CpuHasNativeBf16 in
// src/core/cpus.h; about twice fp32's speed there), fp32 otherwise.
// NotSupported for fp16 on the CPU with a LibTorch that lacks it. `why`,
// when given, gets the reason for an automatic choice ("" otherwise).
Status ResolvePrecision(PrecisionChoice choice, const torch::Device& device, Precision* out,
                        std::string* why = nullptr);

// --precision auto on a GPU of compute capability major.minor: bf16 from
// 8.0 on (Ampere and later compute it natively, and need no loss scaling);
// fp16 with the loss scaler below that (V100 7.0, T4 7.5 run bf16 through
// slow emulation, fp16 on their tensor cores). `why`, when given, says so.
Precision GpuAutoPrecision(int major, int minor, std::string* why = nullptr);

// Autocast to `precision` on `device` for the guard's lifetime (a no-op for
// fp32). Restores the previous state; clears the cast cache when the
// outermost scope ends, as torch.autocast does.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

struct LossScalerOptions {
  bool enabled = true;         // false: scale 1, nothing checked, never skips
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  torch::Device device = torch::kCPU;  // where the gradients are (and the scale is kept)
};

// loss -> Scale(loss).backward() -> UnscaleAndCheck(params) -> step only
// if it returned true -> Update(found_inf).
//
// The scale and the growth tracker live on `device` as GradScaler keeps
// them. Where LibTorch has the fused ops (CUDA; the CPU from LibTorch 2.3)
// the unscale and the inf/NaN check are one
// _amp_foreach_non_finite_check_and_unscale_ per dtype and the update one
// _amp_update_scale_, as in torch.amp.GradScaler; elsewhere the same
// arithmetic runs as ordinary tensor operations.
class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});
  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Divides every defined gradient by the scale, in place. Returns true
  // when all of them are finite. Reads one flag from the device.
  bool UnscaleAndCheck(const std::vector<torch::Tensor>& params);
  // After a step: backoff and reset on inf/NaN, grow after
  // growth_interval clean steps in a row.
  void Update(bool found_inf);

  bool enabled() const { return opt_.enabled; }
  // True when the fused LibTorch ops do the work.
  bool fused() const { return fused_; }
  // These two read the device (a synchronization on a GPU).
  double scale() const;
  int64_t growth_tracker() const;
  int64_t skipped_steps() const { return skipped_; }
  // Restores state saved in a checkpoint.
  void Restore(double scale, int64_t growth_tracker, int64_t skipped);

 private:
  LossScalerOptions opt_;
  bool fused_ = false;
  torch::Tensor scale_;    // float32 [], on opt_.device
  torch::Tensor tracker_;  // int32 [], on opt_.device
  torch::Tensor found_;    // float32 [1]: the last check's inf/NaN flag
  int64_t skipped_ = 0;
};

}  // namespace kiln::train

#endif  // KILN_TRAIN_AMP_H_
