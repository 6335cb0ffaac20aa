// Internal to kiln::train: the Trainer behind Train(), and what its parts
// share. trainer.h stays LibTorch-free; this header is not installed.
//
// Where the trainer's code is, by responsibility:
//   trainer.cc     Train(), the epoch loop (Run), one optimizer step (Step)
//                  and its forward/loss/backward (ForwardBackward), the
//                  evaluation, the reductions over ranks, Ctrl-C
//   setup.cc       start-up: option checks, device, caches, the model, the
//                  loader options
//   checkpoint.cc  checkpoints: the directory swap, state.json, --resume and
//                  its settings check
//   optimizer.cc   optimizers and learning-rate schedules
//   batch_size.cc  --batch-size auto: the search and its trials
//   report.cc      number formatting for the log (no LibTorch)
//   grad_reducer.cc  the gradients' bucketed all-reduce over the ranks
//   collective*.cc the launcher's environment, the device it gives a rank,
//                  the process group (Gloo, NCCL)
//
// Thread-safety: a Trainer is used from one thread.
#ifndef KILN_SRC_TRAIN_TRAINER_INTERNAL_H_
#define KILN_SRC_TRAIN_TRAINER_INTERNAL_H_

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "batch_size.h"
#include "collective.h"
#include "optimizer.h"
#include "grad_reducer.h"
#include "kiln/cache_reader.h"
#include "kiln/train/amp.h"
#include "kiln/train/model.h"
#include "kiln/train/tensor_loader.h"
#include "kiln/train/trainer.h"
#include "report.h"

namespace kiln::train::internal {

using json = nlohmann::json;

// The epoch a mid-epoch checkpoint stopped in, up to that point, over all
// ranks: a resumed run adds to these, so the epoch's loss and accuracy are
// those of the uninterrupted run.
struct EpochSoFar {
  double loss_sum = 0;  // sum of the per-sample losses
  int64_t correct = 0, samples = 0;
  double seconds = 0, wait_seconds = 0;  // training time and data waits
};

struct Checkpoint {
  int64_t epoch = 0;          // the epoch to continue
  int64_t step_in_epoch = 0;  // optimizer steps of that epoch already done (after epoch_skip)
  // The samples of the epoch's permutation skipped at its start (an epoch
  // continued by an elastic resume, Loader::StartEpoch's skip); 0 else.
  int64_t epoch_skip = 0;
  int64_t global_step = 0;
  double scale = 1;
  int64_t growth_tracker = 0, skipped = 0;
  int64_t batch_size = 0;
  int accum_steps = 1;
  std::string model;
  EpochSoFar so_far;
  // The options it must be continued with (Trainer::Settings), by option
  // name; only those recorded are checked (older checkpoints have only
  // --model, --batch-size and --accum-steps).
  json settings = json::object();
  // The names of the parameters in each optimizer group, whose state
  // optimizer.pt holds by position; empty in older checkpoints.
  std::vector<std::vector<std::string>> groups;
};

// The start-up check of --save (checkpoint.cc): that the checkpoint
// directory may be replaced, and that its parent can be created and written,
// so a bad path fails now, not after an epoch.
Status CheckSaveLocation(const std::string& save);

// The accumulators of a stretch of training, on the device: read only at
// log points.
struct Meter {
  torch::Tensor loss_sum, correct;
  int64_t samples = 0;
  void Reset(const torch::Device& d) {
    loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(d));
    correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(d));
    samples = 0;
  }
};

// --profile: the time of a step's phases. Restart() starts a phase, Lap()
// ends it, adding its seconds to a sum; a disabled clock does nothing. On
// CUDA both first wait for the device, so a phase is charged for its own
// kernels, not for those queued before it.
class PhaseClock {
 public:
  void Enable(const torch::Device& device) {
    on_ = true;
    device_ = device;
  }
  void Restart() {
    if (on_) last_ = Now();
  }
  void Lap(double* sum) {
    if (!on_) return;
    const auto now = Now();
    *sum += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point Now() const {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    return std::chrono::steady_clock::now();
  }
  bool on_ = false;
  torch::Device device_ = torch::kCPU;
  std::chrono::steady_clock::time_point last_;
};

// Seconds spent in each phase of the steps of an epoch (--profile).
struct PhaseTimes {
  double forward = 0, backward = 0, optimizer = 0;
};

// Discards what is written to it (the log of ranks other than 0).
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

class Trainer {
 public:
  explicit Trainer(const TrainOptions& o)
      : o_(o), out_(o.log ? o.log->rdbuf() : std::cout.rdbuf()) {}
  Status Run(TrainResult* result);

 private:
  // setup.cc
  Status Setup();
  Status BuildModel();
  TensorLoaderOptions LoaderFor(int64_t batch, bool train) const;
  int64_t EvalBatch() const { return std::max<int64_t>(batch_, 64); }
  // batch_size.cc
  Status ChooseBatchSize();
  BatchTrial Trial(int64_t batch);
  // optimizer.cc
  Status MakeOptimizer();
  // checkpoint.cc
  json Settings() const;
  Status ReadResume();
  Status Resume();
  Status RestoreOptimizer();
  Status Save(const std::string& dir, int64_t epoch, int64_t step_in_epoch,
              const EpochSoFar& so_far = {});
  // trainer.cc
  Status Step(TensorLoader& loader, Meter& meter, bool* epoch_end, bool* stop);
  // One micro-batch: the forward pass under autocast, the loss (with
  // --label-smoothing) and the backward pass of the scaled loss divided by
  // --accum-steps, adding to the gradients. Adds the batch's loss and
  // correct predictions to *meter when it is given. Step and Trial both
  // train through this.
  void ForwardBackward(const torch::Tensor& x, const torch::Tensor& y, Meter* meter);
  Status Evaluate(EpochStats* stats);
  void Metric(const json& j);

  bool lead() const { return !dist_ || dist_->rank() == 0; }
  void ReduceMeter(Meter* m);

  const TrainOptions& o_;
  // The training device is the current one while the Trainer lives (so
  // LibTorch calls that act on the current device act on it), restored after.
  c10::OptionalDeviceGuard device_guard_;
  std::ostream out_;  // the log's buffer; a NullBuffer for ranks other than 0
  NullBuffer null_buffer_;
  std::unique_ptr<Collective> dist_;
  torch::Device device_ = torch::kCPU;  // with an index when CUDA (ChooseDevice)
  std::shared_ptr<HostRing> ring_;      // every loader's host slots
  Precision precision_ = Precision::kFp32;
  std::string precision_why_;  // why --precision auto chose precision_, for the log
  std::unique_ptr<CacheReader> train_, val_;
  int64_t classes_ = 0;
  std::vector<int64_t> sample_shape_;  // C, H, W after the crop
  // --augment rrc in effect (RandomResizedCrop training, Resize + CenterCrop
  // evaluation), and the evaluation's Resize.
  bool rrc_ = false;
  // --res-schedule, and the training crop of the epoch now (max_res until
  // the first epoch, so that the batch size and the model are probed at
  // the largest).
  ResolutionSchedule res_;
  uint32_t train_crop_ = 0;
  uint32_t crop_ = 0;  // --crop, or with --res-schedule and no --crop its MAX
  uint32_t val_resize_ = 0;
  Model model_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::vector<double> base_lr_;  // per parameter group, after --lr-scaling
  LossScaler scaler_{LossScalerOptions{false}};
  std::vector<torch::Tensor> trainable_;
  // Averages trainable_'s gradients over the ranks (distributed only).
  std::unique_ptr<GradReducer> reducer_;
  std::vector<std::string> optimized_;
  std::vector<std::vector<std::string>> groups_;  // optimized_, by optimizer group
  int64_t batch_ = 0;
  int64_t optimizer_state_ = 0;  // bytes, added to each batch-size trial's peak
  std::string resume_dir_;  // the checkpoint --resume reads (FindCheckpoint)
  Checkpoint start_;        // where this run starts (a resumed checkpoint or zero)
  // An elastic resume: the checkpoint was made with another WORLD_SIZE,
  // --batch-size or --accum-steps; its epoch continues after the samples
  // the whole job had consumed (start_consumed_).
  bool elastic_ = false;
  uint64_t start_consumed_ = 0;
  int64_t epoch_now_ = -1, epoch_skip_ = 0;  // the epoch in progress and its skip
  int64_t global_step_ = 0;
  bool first_batch_checked_ = false;
  PhaseClock clock_;   // --profile
  PhaseTimes phases_;  // this epoch's, --profile
  std::ofstream metrics_;
};

}  // namespace kiln::train::internal

#endif  // KILN_SRC_TRAIN_TRAINER_INTERNAL_H_
