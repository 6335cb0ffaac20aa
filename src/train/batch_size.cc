// --batch-size auto: the search (pure, for tests) and the trials that feed it.
#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <iomanip>

#include "trainer_internal.h"

namespace kiln::train {

Status SearchBatchSize(int64_t first, int64_t max_batch, int64_t budget, const BatchTrialFn& trial,
                       int64_t* chosen, std::vector<BatchTrial>* table) {
  if (first < 1 || max_batch < first)
    return Status::InvalidArgument("automatic batch size: nothing to try between " +
                                   std::to_string(first) + " and " + std::to_string(max_batch));
  std::vector<BatchTrial> rows;
  int64_t best = 0;
  double best_rate = 0;
  for (int64_t b = first; b <= max_batch; b *= 2) {
    BatchTrial t = trial(b);
    t.batch = b;
    if (!t.error.ok()) {
      t.note = "failed: stop";
      rows.push_back(t);
      if (table) *table = rows;
      return t.error.WithContext("automatic batch size, trying batch " + std::to_string(b));
    }
    if (t.out_of_memory) {
      t.note = "out of memory: stop";
    } else if (budget > 0 && t.peak_bytes > budget) {
      t.note = "over the memory budget: stop";
    } else if (best > 0 && t.samples_per_second < best_rate * 1.05) {
      t.note = "less than 5% faster: stop";  // not worth the memory: keep the smaller
    }
    const bool stop = !t.note.empty();
    if (!stop && t.samples_per_second > best_rate) {
      best = b;
      best_rate = t.samples_per_second;
    }
    rows.push_back(t);
    if (stop) break;
  }
  if (table) *table = rows;
  if (best == 0)
    return Status::InvalidArgument("automatic batch size: even batch " + std::to_string(first) +
                                   " does not fit (" + rows.front().note +
                                   "); raise --memory-budget or give --batch-size");
  *chosen = best;
  return Status::OK();
}

int64_t OptimizerStateBytes(const TrainOptions& o, int64_t trainable_bytes) {
  if (o.optimizer == OptimizerKind::kAdamW) return 2 * trainable_bytes;
  return o.momentum != 0 ? trainable_bytes : 0;
}

namespace internal {
namespace {

// Peak resident memory of this process since the last ResetPeakMemory().
void ResetPeakMemory() {
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";
}
int64_t PeakMemoryBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}
// GPU memory in use and in all on `device`, from the CUDA runtime that a
// CUDA LibTorch has loaded (cudaMemGetInfo, found with dlsym, so no CUDA
// header is needed; it asks about the current device, which a guard makes
// `device`). In use includes what LibTorch's caching allocator holds,
// which only grows during the batch-size search: after a trial it is that
// trial's peak. False when there is no runtime.
bool GpuMemory(const torch::Device& device, int64_t* used, int64_t* total) {
  using MemGetInfo = int (*)(size_t*, size_t*);
  static MemGetInfo fn = reinterpret_cast<MemGetInfo>(::dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  if (fn == nullptr) return false;
  c10::DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  if (fn(&free_bytes, &total_bytes) != 0 || total_bytes == 0) return false;
  *used = static_cast<int64_t>(total_bytes - free_bytes);
  *total = static_cast<int64_t>(total_bytes);
  return true;
}

int64_t PhysicalMemoryBytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemTotal:", 0) == 0) return std::stoll(line.substr(9)) * 1024;
  return 0;
}

}  // namespace

BatchTrial Trainer::Trial(int64_t batch) {
  BatchTrial t;
  t.batch = batch;
  // Weights and BatchNorm statistics are put back afterwards: trials do not
  // train. Gradients stay between its passes, as LibTorch 1.13's zero_grad
  // keeps them while training (2.x frees them: then the peak is on the safe side).
  std::vector<torch::Tensor> saved;
  for (auto& [n, b] : model_.Buffers()) saved.push_back(b.clone());
  try {
    std::unique_ptr<TensorLoader> loader;
    // Errors other than memory exhaustion (bad data, a failed device) end
    // the search with them: they are not about this batch size.
    t.error = TensorLoader::Open(train_.get(), LoaderFor(batch, /*train=*/true), &loader);
    if (!t.error.ok()) return t;
    ResetPeakMemory();
    model_.SetTraining(true);
    t.error = loader->StartEpoch(0);
    if (!t.error.ok()) return t;
    constexpr int kWarm = 1, kTimed = 3;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kWarm + kTimed; ++i) {
      if (i == kWarm) t0 = std::chrono::steady_clock::now();
      torch::Tensor x, y;
      Status n = loader->Next(&x, &y);
      if (n.IsNotFound()) {
        n = loader->StartEpoch(static_cast<uint64_t>(i) + 1);
        if (n.ok()) n = loader->Next(&x, &y);
      }
      if (!n.ok()) {
        t.error = n;
        break;
      }
      ForwardBackward(x, y, nullptr);
      if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    }
    if (t.error.ok()) t.samples_per_second = batch * kTimed / std::max(1e-9, Seconds(t0));
    int64_t used = 0, total = 0;
    if (device_.is_cpu()) t.peak_bytes = PeakMemoryBytes();
    else if (GpuMemory(device_, &used, &total))
      t.peak_bytes = used;
    if (t.peak_bytes > 0) t.peak_bytes += optimizer_state_;
  } catch (const c10::Error& e) {
    if (!IsOutOfMemory(e)) throw;
    t.out_of_memory = true;
  }
  for (auto& p : trainable_) p.mutable_grad() = torch::Tensor();
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& [n, b] : model_.Buffers()) b.copy_(saved[i++]);
  return t;
}

Status Trainer::ChooseBatchSize() {
  if (o_.batch_size > 0) {
    batch_ = o_.batch_size;
    return Status::OK();
  }
  if (start_.batch_size > 0) {  // resuming: keep the checkpoint's
    batch_ = start_.batch_size;
    return Status::OK();
  }
  int64_t budget = o_.memory_budget;
  int64_t gpu_used = 0, gpu_total = 0;
  const bool gpu_measured = device_.is_cuda() && GpuMemory(device_, &gpu_used, &gpu_total);
  int64_t trainable_bytes = 0;
  for (const auto& p : trainable_)
    trainable_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  optimizer_state_ = OptimizerStateBytes(o_, trainable_bytes);
  if (budget == 0 && device_.is_cpu()) budget = PhysicalMemoryBytes() / 2;
  if (budget == 0 && gpu_measured) budget = gpu_total / 10 * 9;
  const int64_t samples = static_cast<int64_t>(train_->size());
  const int64_t max_batch = std::min<int64_t>(o_.max_batch, samples / o_.accum_steps);
  const int64_t first = std::min<int64_t>(32, std::max<int64_t>(1, max_batch));
  std::vector<BatchTrial> table;
  Status s = SearchBatchSize(first, max_batch, budget, [this](int64_t b) { return Trial(b); },
                             &batch_, &table);
  out_ << "batch  automatic batch size (" << (device_.is_cpu() ? "peak RSS" : "peak memory")
       << ", budget " << (budget > 0 ? Fixed(budget / 1e6, 0) + " MB" : std::string("none"))
       << "; peaks include " << Fixed(optimizer_state_ / 1e6, 1) << " MB of "
       << OptimizerName(o_.optimizer) << " state, which the trials do not hold):\n"
       << "  batch  samples/s  peak MB  note\n";
  for (const auto& t : table)
    out_ << "  " << std::setw(5) << t.batch << "  " << std::setw(9)
         << (t.out_of_memory ? std::string("-") : Fixed(t.samples_per_second, 0)) << "  "
         << std::setw(7) << (t.peak_bytes > 0 ? Fixed(t.peak_bytes / 1e6, 0) : std::string("-"))
         << "  " << t.note << "\n";
  KILN_RETURN_IF_ERROR(s);
  if (dist_) {  // every rank takes the smallest choice
    torch::Tensor b = torch::tensor({batch_}, torch::kInt64);
    dist_->AllReduceMin(b);
    batch_ = b.item<int64_t>();
  }
  out_ << "  chose " << batch_ << "\n";
  if (device_.is_cuda() && !gpu_measured)
    out_ << "  (the CUDA runtime's cudaMemGetInfo was not found: GPU memory is not measured, the "
            "search stops at out-of-memory or when throughput stops growing)\n";
  return Status::OK();
}

}  // namespace internal
}  // namespace kiln::train
