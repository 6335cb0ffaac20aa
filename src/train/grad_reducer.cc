// GradReducer: bucketed gradient all-reduce with DDP's semantics.
#include "grad_reducer.h"

#include <torch/torch.h>

namespace kiln::train::internal {

GradReducer::GradReducer(Collective* dist, std::vector<torch::Tensor> params,
                         const GradReducerOptions& options)
    : dist_(dist),
      params_(std::move(params)),
      bucket_of_(params_.size()),
      slot_of_(params_.size()),
      filled_(params_.size(), 0) {
  // Buckets over the parameters in reverse order.
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    const int64_t cap = buckets_.size() <= 1 ? options.first_bucket_bytes : options.bucket_bytes;
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fits = !buckets_.empty() && bytes + size <= cap &&
                      params_[buckets_.back().params.front()].scalar_type() == p.scalar_type();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    bucket_of_[k] = static_cast<int>(buckets_.size() - 1);
    slot_of_[k] = static_cast<int>(b.params.size());
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bytes += size;
  }
  for (size_t n = 0; n < buckets_.size(); ++n) {
    Bucket& b = buckets_[n];
    // The gradients, a flag per parameter, and in the last bucket the stop flag.
    const int64_t flags = static_cast<int64_t>(b.params.size()) + (n + 1 == buckets_.size());
    b.buffer = torch::zeros({b.numel + flags}, torch::TensorOptions()
                                                   .dtype(params_[b.params.front()].scalar_type())
                                                   .device(dist_->device()));
  }
  for (size_t k = 0; k < params_.size(); ++k)
    hooks_.push_back(params_[k].register_hook([this, k](torch::Tensor g) { OnGradient(k, g); }));
}

GradReducer::~GradReducer() {
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

void GradReducer::Arm() {
  std::lock_guard<std::mutex> lock(mu_);
  started_in_backward_ = 0;
  armed_ = true;
}

void GradReducer::OnGradient(size_t k, const torch::Tensor& grad) {
  if (!armed_.load()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (filled_[k] || hook_error_) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor& p = params_[k];
  Bucket& b = buckets_[bucket_of_[k]];
  const int64_t slot = slot_of_[k];
  // The hook sees this pass's gradient before it is added to .grad (the
  // earlier micro-batches' sum).
  const torch::Tensor g = p.grad().defined() ? p.grad() + grad : grad;
  b.buffer.narrow(0, b.offsets[slot], p.numel()).view(p.sizes()).copy_(g);
  b.buffer.narrow(0, b.numel + slot, 1).fill_(1);
  filled_[k] = 1;
  ++b.filled;
  try {
    StartReady();
  } catch (...) {  // Finish() rethrows it on the training thread
    hook_error_ = std::current_exception();
  }
}

void GradReducer::StartReady() {
  while (next_ + 1 < buckets_.size() &&
         buckets_[next_].filled == static_cast<int>(buckets_[next_].params.size())) {
    Start(buckets_[next_++]);
    ++started_in_backward_;
  }
}

void GradReducer::Start(Bucket& b) { b.pending = dist_->StartAllReduceSum(b.buffer); }

bool GradReducer::Finish(bool stop) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  // Back to the state of a new step, whatever happens below.
  struct Reset {
    GradReducer* r;
    ~Reset() {
      std::fill(r->filled_.begin(), r->filled_.end(), 0);
      for (auto& b : r->buckets_) {
        b.filled = 0;
        b.pending.reset();
      }
      r->next_ = 0;
      r->hook_error_ = nullptr;
    }
  } reset{this};
  if (hook_error_) std::rethrow_exception(hook_error_);
  torch::NoGradGuard no_grad;
  for (size_t n = next_; n < buckets_.size(); ++n) {
    Bucket& b = buckets_[n];
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const size_t k = b.params[slot];
      if (filled_[k]) continue;
      const torch::Tensor& p = params_[k];
      const torch::Tensor g = p.grad();
      torch::Tensor dst = b.buffer.narrow(0, b.offsets[slot], p.numel());
      if (g.defined())
        dst.view(p.sizes()).copy_(g);
      else
        dst.zero_();
      b.buffer.narrow(0, b.numel + static_cast<int64_t>(slot), 1).fill_(g.defined() ? 1 : 0);
    }
    if (n + 1 == buckets_.size()) b.buffer.narrow(0, b.buffer.numel() - 1, 1).fill_(stop ? 1 : 0);
    Start(b);
  }
  next_ = buckets_.size();
  for (auto& b : buckets_) b.pending->Wait();
  // The flags of every bucket, read on the host at once.
  std::vector<torch::Tensor> flags;
  for (auto& b : buckets_)
    flags.push_back(b.buffer.narrow(0, b.numel, b.buffer.numel() - b.numel).to(torch::kFloat));
  const torch::Tensor host = torch::cat(flags).to(torch::kCPU);
  const auto f = host.accessor<float, 1>();
  int64_t at = 0;
  for (auto& b : buckets_) {
    torch::Tensor sum = b.buffer.narrow(0, 0, b.numel);
    sum.div_(dist_->world());
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      if (f[at + static_cast<int64_t>(slot)] <= 0) continue;  // no rank has a gradient: left alone
      torch::Tensor& p = params_[b.params[slot]];
      const torch::Tensor avg = sum.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(avg);
      else
        p.mutable_grad() = torch::empty_like(p).copy_(avg);
    }
    at += static_cast<int64_t>(b.params.size());
  }
  return f[host.numel() - 1] > 0;
}

}  // namespace kiln::train::internal
