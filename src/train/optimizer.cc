// Optimizers and learning-rate schedules of kiln train.
#include <algorithm>
#include <cmath>

#include "trainer_internal.h"

namespace kiln::train {

double ScheduledLr(const TrainOptions& o, double lr, int64_t step, int64_t steps_per_epoch,
                   int64_t total_steps) {
  constexpr double kPi = 3.14159265358979323846;
  const int64_t warm = static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch));
  if (o.schedule == LrSchedule::kOneCycle) {
    // torch.optim.lr_scheduler.OneCycleLR (cosine): from lr/25 up to lr, then down to lr/25e4.
    const int64_t up = warm > 0 ? warm : std::max<int64_t>(1, std::llround(0.3 * total_steps));
    const double initial = lr / 25.0, final_lr = initial / 1e4;
    if (step < up) return initial + (lr - initial) * (1 - std::cos(kPi * step / up)) / 2;
    const double t = static_cast<double>(step - up) / std::max<int64_t>(1, total_steps - up);
    return final_lr + (lr - final_lr) * (1 + std::cos(kPi * std::min(1.0, t))) / 2;
  }
  if (step < warm) return lr * static_cast<double>(step + 1) / warm;
  if (o.schedule == LrSchedule::kStep) {
    const int64_t epoch = steps_per_epoch > 0 ? step / steps_per_epoch : 0;
    return lr * std::pow(o.gamma, static_cast<double>(epoch / std::max(1, o.step_epochs)));
  }
  if (o.schedule == LrSchedule::kCosine) {
    const double t = static_cast<double>(step - warm) / std::max<int64_t>(1, total_steps - warm);
    return lr * 0.5 * (1 + std::cos(kPi * std::min(1.0, t)));
  }
  return lr;  // constant
}

namespace internal {

Status Trainer::MakeOptimizer() {
  const int64_t ranks = dist_ ? dist_->world() : 1;
  const int64_t effective = batch_ * o_.accum_steps * ranks;
  double factor = 1;
  if (o_.lr_scaling == LrScaling::kLinear) factor = static_cast<double>(effective) / o_.base_batch;
  if (o_.lr_scaling == LrScaling::kSqrt) factor = std::sqrt(static_cast<double>(effective) / o_.base_batch);
  const double lr = o_.lr * factor;
  const double lr_head = (o_.lr_head >= 0 ? o_.lr_head : o_.lr) * factor;
  std::vector<torch::Tensor> body, head;
  std::vector<std::string> body_names, head_names;
  const std::string& h = model_.head();
  optimized_.clear();
  for (const auto& [name, p] : model_.Parameters(true)) {
    const bool in_head = !h.empty() && o_.lr_head >= 0 && name.rfind(h + ".", 0) == 0;
    (in_head ? head : body).push_back(p);
    (in_head ? head_names : body_names).push_back(name);
    optimized_.push_back(name);
  }
  groups_.clear();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  base_lr_.clear();
  auto options = [&](double rate) -> std::unique_ptr<torch::optim::OptimizerOptions> {
    if (o_.optimizer == OptimizerKind::kAdamW)
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(rate).weight_decay(o_.weight_decay));
    return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(rate)
                                                          .momentum(o_.momentum)
                                                          .nesterov(o_.nesterov)
                                                          .weight_decay(o_.weight_decay));
  };
  if (!body.empty()) {
    groups.emplace_back(body, options(lr));
    groups_.push_back(body_names);
    base_lr_.push_back(lr);
  }
  if (!head.empty()) {
    groups.emplace_back(head, options(lr_head));
    groups_.push_back(head_names);
    base_lr_.push_back(lr_head);
  }
  if (o_.optimizer == OptimizerKind::kAdamW)
    opt_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lr));
  else
    opt_ = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lr));
  out_ << "optim  " << OptimizerName(o_.optimizer) << ", lr " << lr;
  if (!head.empty()) out_ << " (head " << lr_head << ")";
  if (factor != 1) out_ << " (" << LrScalingName(o_.lr_scaling) << " scaling x" << Fixed(factor, 3) << ")";
  out_ << ", " << LrScheduleName(o_.schedule) << " schedule; batch " << batch_ << " x " << o_.accum_steps
       << " accumulation" << (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : std::string())
       << " = " << effective << " per step; precision " << PrecisionName(precision_)
       << (precision_why_.empty() ? "" : " (" + precision_why_ + ")")
       << " on " << device_.str() << "\n";
  return Status::OK();
}

}  // namespace internal
}  // namespace kiln::train
