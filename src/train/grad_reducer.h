// GradReducer: averages the gradients of a set of parameters over the ranks
// of a Collective, in a few large buckets, as DistributedDataParallel does
// (internal to kiln::train; any backend).
//
// Buckets: the parameters in reverse order (roughly the order backward
// produces their gradients), cut into buckets of about `bucket_bytes`
// (the first one smaller, so communication starts early), one dtype each.
// A bucket is a flat buffer on the collective's device holding its
// parameters' gradients and, after them, one "has a gradient" flag per
// parameter (and in the last bucket this rank's stop flag): one all-reduce
// per bucket carries both.
//
// Overlap: Arm() before the backward pass of a step's last micro-batch; a
// hook on each parameter then copies its gradient into its bucket as
// backward produces it, and starts the bucket's all-reduce once the bucket
// is complete - in bucket order, so every rank starts the same operations
// in the same order. The last bucket, and any bucket with a parameter that
// got no gradient in that pass, start in Finish().
//
// Semantics (DistributedDataParallel's, with find_unused_parameters): a
// parameter's gradient is the sum over ranks divided by the number of
// ranks, where a rank without a gradient for it (.grad undefined) adds
// zeros. A parameter no rank has a gradient for is left alone: its .grad
// stays undefined, so the optimizer skips it - no weight decay, no
// momentum - exactly as in one process whose batch is every rank's batch.
// Every rank reduces every bucket every step, so ranks that disagree on
// which parameters got gradients cannot deadlock.
//
// Thread-safety: Arm() and Finish() on the training thread; the hooks run
// on LibTorch's autograd threads while that thread waits in backward().
#ifndef KILN_SRC_TRAIN_GRAD_REDUCER_H_
#define KILN_SRC_TRAIN_GRAD_REDUCER_H_

#include <torch/types.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "collective.h"

namespace kiln::train::internal {

struct GradReducerOptions {
  int64_t bucket_bytes = 25 << 20;       // gradients per bucket (DDP's bucket_cap_mb 25)
  int64_t first_bucket_bytes = 1 << 20;  // the first bucket's (DDP's 1 MB)
};

class GradReducer {
 public:
  // REQUIRES: `dist` and `params` outlive the reducer; params are the
  // trainable parameters, the same (names, shapes, order) on every rank.
  GradReducer(Collective* dist, std::vector<torch::Tensor> params,
              const GradReducerOptions& options = {});
  ~GradReducer();  // removes the hooks
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward pass finishes the step's gradients: start buckets
  // from the hooks as they complete.
  void Arm();
  // Starts the buckets not started yet, waits for all, and leaves the
  // averaged gradients in .grad (see Semantics above). Returns true when
  // any rank passed stop = true. Throws DistributedError.
  bool Finish(bool stop);

  int buckets() const { return static_cast<int>(buckets_.size()); }
  // Buckets the hooks started during the last armed backward pass.
  int started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    int64_t numel = 0;  // gradient elements; the flags follow
    torch::Tensor buffer;
    int filled = 0;  // parameters copied in during this pass
    std::unique_ptr<PendingCollective> pending;
  };
  void OnGradient(size_t param, const torch::Tensor& grad);
  void StartReady();  // REQUIRES: mu_ held
  void Start(Bucket& b);

  Collective* dist_;
  std::vector<torch::Tensor> params_;
  std::vector<int> bucket_of_;   // per parameter
  std::vector<int> slot_of_;     // its position within the bucket
  std::vector<char> filled_;     // per parameter, this pass
  std::vector<unsigned> hooks_;  // per parameter
  std::vector<Bucket> buckets_;
  std::mutex mu_;
  std::atomic<bool> armed_{false};
  size_t next_ = 0;  // the next bucket to start
  int started_in_backward_ = 0;
  std::exception_ptr hook_error_;  // a start that failed in a hook
};

}  // namespace kiln::train::internal

#endif  // KILN_SRC_TRAIN_GRAD_REDUCER_H_
