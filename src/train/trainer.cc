#include "kiln/train/trainer.h"

#include <dlfcn.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "kiln/train/amp.h"
#include "kiln/train/model.h"
#include "kiln/train/tensor_loader.h"
#include "kiln/verify.h"
#include "collective.h"
#include "kiln/file.h"

namespace kiln::train {
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- pure parts ---------------------------------------------------------------

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

double ScheduledLr(const TrainOptions& o, double lr, int64_t step, int64_t steps_per_epoch,
                   int64_t total_steps) {
  constexpr double kPi = 3.14159265358979323846;
  const int64_t warm = static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch));
  if (o.schedule == "onecycle") {
    // torch.optim.lr_scheduler.OneCycleLR (cosine): from lr/25 up to lr, then down to lr/25e4.
    const int64_t up = warm > 0 ? warm : std::max<int64_t>(1, std::llround(0.3 * total_steps));
    const double initial = lr / 25.0, final_lr = initial / 1e4;
    if (step < up) return initial + (lr - initial) * (1 - std::cos(kPi * step / up)) / 2;
    const double t = static_cast<double>(step - up) / std::max<int64_t>(1, total_steps - up);
    return final_lr + (lr - final_lr) * (1 + std::cos(kPi * std::min(1.0, t))) / 2;
  }
  if (step < warm) return lr * static_cast<double>(step + 1) / warm;
  if (o.schedule == "step") {
    const int64_t epoch = steps_per_epoch > 0 ? step / steps_per_epoch : 0;
    return lr * std::pow(o.gamma, static_cast<double>(epoch / std::max(1, o.step_epochs)));
  }
  if (o.schedule == "cosine") {
    const double t = static_cast<double>(step - warm) / std::max<int64_t>(1, total_steps - warm);
    return lr * 0.5 * (1 + std::cos(kPi * std::min(1.0, t)));
  }
  return lr;  // constant
}

namespace {

std::atomic<int> g_sigint{0};
extern "C" void OnSigint(int) {
  if (g_sigint.fetch_add(1) > 0) std::_Exit(130);  // a second Ctrl-C: leave now
}

struct SigintScope {
  using Handler = void (*)(int);
  Handler previous;
  SigintScope() {
    g_sigint = 0;
    previous = std::signal(SIGINT, OnSigint);
  }
  ~SigintScope() { std::signal(SIGINT, previous); }
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string Thousands(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0 && s[i - 1] != '-') out += ',';
    out += s[i];
  }
  return out;
}

std::string Fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

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
// GPU memory in use and in all on the current device, from the CUDA
// runtime that a CUDA LibTorch has loaded (cudaMemGetInfo, found with
// dlsym, so no CUDA header is needed). In use includes what LibTorch's
// caching allocator holds, which only grows during the batch-size search:
// after a trial it is that trial's peak. False when there is no runtime.
bool GpuMemory(int64_t* used, int64_t* total) {
  using MemGetInfo = int (*)(size_t*, size_t*);
  static MemGetInfo fn = reinterpret_cast<MemGetInfo>(::dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  if (fn == nullptr) return false;
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

Status OpenCache(const std::string& dir, bool verify, std::unique_ptr<CacheReader>* out) {
  if (verify) {
    VerifyOptions vo;
    vo.level = VerifyLevel::kQuick;
    VerifyReport report;
    KILN_RETURN_IF_ERROR(VerifyCache(dir, vo, &report));
    if (!report.clean()) {
      const VerifyProblem& p = report.problems.front();
      std::string where = p.index >= 0 ? "record " + std::to_string(p.index) : "";
      if (!p.shard.empty()) where += (where.empty() ? "" : ", ") + p.shard;
      return Status::Corruption(dir + ": kiln verify --level quick found " +
                                std::to_string(report.problems.size()) + " problem(s); first: " +
                                (where.empty() ? "" : where + ": ") + p.what +
                                ". Run `kiln verify " + dir +
                                "` for all of them; `kiln build ... --repair` rewrites bad records");
    }
  }
  return CacheReader::Open(dir, ReaderOptions{}, out);
}

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
  int64_t step_in_epoch = 0;  // optimizer steps of that epoch already done
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

// A checkpoint directory as a path whose last part names it: no trailing
// separator and no "." or ".." parts (an absolute path when those were its
// last part), so that DIR.partial and DIR.old are its siblings. "ck/" +
// ".partial" would be a folder inside ck, and ck cannot be renamed into it.
fs::path CheckpointDir(const std::string& dir) {
  auto normal = [](const fs::path& p) {
    std::string s = p.lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return fs::path(s);
  };
  fs::path p = normal(dir);
  if (p.filename() == "." || p.filename() == "..") {
    std::error_code ec;
    const fs::path absolute = fs::absolute(p, ec);
    if (!ec) p = normal(absolute);
  }
  return p;
}

fs::path Sibling(const fs::path& dir, const std::string& suffix) {
  return fs::path(dir.string() + suffix);
}

// A checkpoint is complete once its state.json exists: SaveCheckpoint
// renames it into place after every other file is written.
bool IsComplete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "state.json", ec);
}

// OK when a save may replace `dir`: absent, an empty directory or a
// checkpoint. Each save replaces the whole directory, so a directory of
// other files would be deleted.
Status CheckReplaceable(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return Status::OK();
  if (!fs::is_directory(st))
    return Status::InvalidArgument(dir.string() +
                                   " exists and is not a directory; give a new directory for the "
                                   "checkpoint or one that --save wrote");
  if (IsComplete(dir) || fs::is_empty(dir, ec)) return Status::OK();
  return Status::InvalidArgument(
      dir.string() +
      " holds other files and no kiln checkpoint (no state.json); each save replaces the whole "
      "directory, so give a new directory or one that --save wrote");
}

// The start-up check of --save: that the checkpoint directory may be
// replaced, and that its parent can be created and written (a save creates
// and renames siblings there), so a bad path fails now, not after an epoch.
Status CheckSaveLocation(const std::string& save) {
  const std::string option = "--save " + save;
  const fs::path dir = CheckpointDir(save);
  if (dir.filename().empty())
    return Status::InvalidArgument(option + ": give a directory to hold the checkpoint, not " +
                                   dir.string());
  KILN_RETURN_IF_ERROR(CheckReplaceable(dir).WithContext(option));
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    return Status::IOError(option + ": cannot create " + parent.string() + ": " + ec.message() +
                           "; choose a location that can be written");
  const fs::path probe = Sibling(dir, ".write-test-" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr)
    return Status::IOError(option + ": cannot write in " + parent.string() + ": " +
                           std::strerror(errno) + "; choose a location that can be written");
  std::fclose(f);
  fs::remove(probe, ec);
  return Status::OK();
}

// The checkpoint that --resume DIR names, in *found: DIR when complete.
// A save stopped between its two renames (DIR -> DIR.old, DIR.partial ->
// DIR) leaves no DIR: then DIR.partial, the newer, when complete (its
// state.json is written last), else DIR.old. *fallback says it was one of
// those.
Status FindCheckpoint(const std::string& dir, std::string* found, bool* fallback) {
  const fs::path d = CheckpointDir(dir);
  const fs::path candidates[] = {d, Sibling(d, ".partial"), Sibling(d, ".old")};
  for (const fs::path& c : candidates) {
    if (!IsComplete(c)) continue;
    *found = c == d ? dir : c.string();
    *fallback = c != d;
    return Status::OK();
  }
  return Status::NotFound(dir + ": not a kiln checkpoint (no state.json, nor a complete " +
                          candidates[1].string() + " or " + candidates[2].string() +
                          " from an interrupted save); give the directory that --save wrote");
}

// Writes DIR.partial/ in full, state.json last (by rename), then swaps it in
// for DIR: DIR -> DIR.old, DIR.partial -> DIR, DIR.old deleted. A crash at
// any point leaves a complete checkpoint as DIR, or, between the two renames,
// as DIR.partial and DIR.old (FindCheckpoint takes those). DIR.partial and
// DIR.old are deleted only while DIR is complete, so a save never deletes the
// only complete copy.
Status SaveCheckpoint(const std::string& dir, Model& model, torch::optim::Optimizer& opt,
                      const Checkpoint& c) {
  const fs::path final_dir = CheckpointDir(dir), partial = Sibling(final_dir, ".partial"),
                 old = Sibling(final_dir, ".old");
  std::error_code ec;
  if (!IsComplete(final_dir)) {
    KILN_RETURN_IF_ERROR(CheckReplaceable(final_dir));
    // An earlier save stopped between its renames: first make the newest
    // complete copy DIR again.
    for (const fs::path& spare : {partial, old}) {
      if (!IsComplete(spare)) continue;
      fs::remove(final_dir, ec);  // absent or empty
      fs::rename(spare, final_dir, ec);
      if (ec)
        return Status::IOError(dir + ": cannot restore the checkpoint " + spare.string() +
                               " left by an interrupted save: " + ec.message());
      break;
    }
  }
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) return Status::IOError(partial.string() + ": " + ec.message());
  KILN_RETURN_IF_ERROR(model.Save((partial / "model.pt").string()));
  try {
    torch::save(opt, (partial / "optimizer.pt").string());
    torch::save(at::detail::getDefaultCPUGenerator().get_state(), (partial / "rng.pt").string());
  } catch (const c10::Error& e) {
    return Status::IOError(partial.string() + ": cannot write the optimizer state: " +
                           e.what_without_backtrace());
  }
  json j = {{"format", 1},
            {"kiln_version", KilnVersion()},
            {"epoch", c.epoch},
            {"step_in_epoch", c.step_in_epoch},
            {"global_step", c.global_step},
            {"loss_scale", c.scale},
            {"growth_tracker", c.growth_tracker},
            {"skipped_steps", c.skipped},
            {"batch_size", c.batch_size},
            {"accum_steps", c.accum_steps},
            {"model", c.model},
            {"epoch_so_far",
             {{"loss_sum", c.so_far.loss_sum},
              {"correct", c.so_far.correct},
              {"samples", c.so_far.samples},
              {"seconds", c.so_far.seconds},
              {"data_wait_seconds", c.so_far.wait_seconds}}},
            {"settings", c.settings},
            {"param_groups", c.groups}};
  KILN_RETURN_IF_ERROR(
      WriteFileAtomic(partial.string(), "state.json", "state.json.tmp", j.dump(2) + "\n"));
  if (fs::exists(final_dir)) {  // complete, or empty
    fs::remove_all(old, ec);
    if (!ec) fs::rename(final_dir, old, ec);
    if (ec)
      return Status::IOError(dir + ": cannot replace the previous checkpoint: " + ec.message());
  }
  fs::rename(partial, final_dir, ec);
  if (ec) return Status::IOError(dir + ": " + ec.message());
  fs::remove_all(old, ec);
  return Status::OK();
}

// Reads the state.json of the complete checkpoint `dir` (FindCheckpoint's).
Status ReadCheckpointState(const std::string& dir, Checkpoint* c) {
  const fs::path p = fs::path(dir) / "state.json";
  std::ifstream f(p);
  if (!f) return Status::IOError(p.string() + ": cannot read");
  try {
    json j = json::parse(f);
    c->epoch = j.at("epoch").get<int64_t>();
    c->step_in_epoch = j.at("step_in_epoch").get<int64_t>();
    c->global_step = j.at("global_step").get<int64_t>();
    c->scale = j.at("loss_scale").get<double>();
    c->growth_tracker = j.at("growth_tracker").get<int64_t>();
    c->skipped = j.at("skipped_steps").get<int64_t>();
    c->batch_size = j.at("batch_size").get<int64_t>();
    c->accum_steps = j.at("accum_steps").get<int>();
    c->model = j.at("model").get<std::string>();
    // Fields older checkpoints lack.
    if (j.contains("epoch_so_far")) {
      const json& e = j.at("epoch_so_far");
      c->so_far.loss_sum = e.at("loss_sum").get<double>();
      c->so_far.correct = e.at("correct").get<int64_t>();
      c->so_far.samples = e.at("samples").get<int64_t>();
      c->so_far.seconds = e.at("seconds").get<double>();
      c->so_far.wait_seconds = e.at("data_wait_seconds").get<double>();
    }
    c->settings = {{"--model", c->model},
                   {"--batch-size", c->batch_size},
                   {"--accum-steps", c->accum_steps}};
    if (j.contains("settings")) c->settings.update(j.at("settings"));
    if (j.contains("param_groups"))
      c->groups = j.at("param_groups").get<std::vector<std::vector<std::string>>>();
  } catch (const json::exception& e) {
    return Status::Corruption(p.string() + ": " + e.what());
  }
  return Status::OK();
}

// How a message shows `option` set to `value` in a run: "--seed 5",
// "--flip", "no --lr-head", "WORLD_SIZE=2".
std::string Shown(const std::string& option, const json& value) {
  if (option.rfind("--", 0) != 0) return option + "=" + value.dump();
  if (value.is_boolean()) return value.get<bool>() ? option : "no " + option;
  if (value.is_array()) {
    std::string all;
    for (const auto& v : value) all += (all.empty() ? "" : ",") + v.get<std::string>();
    return all.empty() ? "no " + option : option + " " + all;
  }
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    return s.empty() ? "no " + option : option + " " + s;
  }
  if (option == "--lr-head" && value.get<double>() < 0) return "no " + option;
  return option + " " + value.dump();
}

// "2 group(s): fc1.weight ... fc2.bias (4 tensors); fc.weight ... fc.bias (2 tensors)".
std::string DescribeGroups(const std::vector<std::vector<std::string>>& groups) {
  std::string s = std::to_string(groups.size()) + " group(s)";
  for (size_t g = 0; g < groups.size(); ++g) {
    s += g == 0 ? ": " : "; ";
    s += groups[g].empty() ? "empty"
                           : groups[g].front() + " ... " + groups[g].back() + " (" +
                                 std::to_string(groups[g].size()) + " tensors)";
  }
  return s;
}

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
  Status Setup();
  Status BuildModel();
  Status ChooseBatchSize();
  BatchTrial Trial(int64_t batch);
  TensorLoaderOptions LoaderFor(int64_t batch, bool train) const;
  Status MakeOptimizer();
  json Settings() const;
  Status ReadResume();
  Status Resume();
  Status RestoreOptimizer();
  Status Step(TensorLoader& loader, Meter& meter, bool* epoch_end, bool* stop);
  Status Evaluate(EpochStats* stats);
  void Metric(const json& j);
  Status Save(const std::string& dir, int64_t epoch, int64_t step_in_epoch,
              const EpochSoFar& so_far = {});

  bool lead() const { return !dist_ || dist_->rank() == 0; }
  // Sums and averages the trainable gradients over the ranks, with the
  // Ctrl-C flag in the same message; returns whether any rank was stopped.
  bool ReduceGradients(bool stop_here);
  void ReduceMeter(Meter* m);

  const TrainOptions& o_;
  std::ostream out_;  // the log's buffer; a NullBuffer for ranks other than 0
  NullBuffer null_buffer_;
  std::unique_ptr<Collective> dist_;
  torch::Device device_ = torch::kCPU;
  Precision precision_ = Precision::kFp32;
  std::unique_ptr<CacheReader> train_, val_;
  int64_t classes_ = 0;
  std::vector<int64_t> sample_shape_;  // C, H, W after the crop
  Model model_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::vector<double> base_lr_;  // per parameter group, after --lr-scaling
  LossScaler scaler_{LossScalerOptions{false}};
  std::vector<torch::Tensor> trainable_;
  std::vector<std::string> optimized_;
  std::vector<std::vector<std::string>> groups_;  // optimized_, by optimizer group
  int64_t batch_ = 0;
  std::string resume_dir_;  // the checkpoint --resume reads (FindCheckpoint)
  Checkpoint start_;        // where this run starts (a resumed checkpoint or zero)
  int64_t global_step_ = 0;
  bool first_batch_checked_ = false;
  std::ofstream metrics_;
};

Status Trainer::Setup() {
  if (o_.data.empty()) return Status::InvalidArgument("--data: give the training cache directory");
  if (o_.accum_steps < 1) return Status::InvalidArgument("--accum-steps must be at least 1");
  if (o_.epochs < 1) return Status::InvalidArgument("--epochs must be at least 1");
  if (o_.optimizer != "sgd" && o_.optimizer != "adamw")
    return Status::InvalidArgument("--optimizer " + o_.optimizer + ": expected sgd or adamw");
  if (o_.schedule != "constant" && o_.schedule != "step" && o_.schedule != "cosine" &&
      o_.schedule != "onecycle")
    return Status::InvalidArgument("--schedule " + o_.schedule +
                                   ": expected constant, step, cosine or onecycle");
  if (o_.lr_scaling != "none" && o_.lr_scaling != "linear" && o_.lr_scaling != "sqrt")
    return Status::InvalidArgument("--lr-scaling " + o_.lr_scaling + ": expected none, linear or sqrt");
  if (o_.base_batch < 1)
    return Status::InvalidArgument("--base-batch " + std::to_string(o_.base_batch) +
                                   ": must be at least 1 (the batch size --lr was chosen for)");
  if (o_.threads > 0) torch::set_num_threads(o_.threads);

  // Launched like torchrun: one process per rank, rank 0 logs and saves.
  std::string joined;
  KILN_RETURN_IF_ERROR(JoinFromEnvironment(&dist_, &joined));
  if (dist_) {
    if (!lead()) out_.rdbuf(&null_buffer_);
    out_ << "dist   " << joined << ": each rank trains on its share of every epoch\n";
  }
  if (!o_.save.empty() && lead()) KILN_RETURN_IF_ERROR(CheckSaveLocation(o_.save));

  // Device: one for model and data (under a launcher, LOCAL_RANK's GPU).
  const char* local_rank = std::getenv("LOCAL_RANK");
  const int gpu = dist_ && local_rank ? std::atoi(local_rank) : 0;
  if (o_.device == "auto") {
    device_ = torch::cuda::is_available() ? torch::Device(torch::kCUDA, gpu) : torch::Device(torch::kCPU);
  } else {
    try {
      device_ = torch::Device(o_.device);
    } catch (const c10::Error&) {
      return Status::InvalidArgument("--device " + o_.device + ": expected auto, cpu, cuda or cuda:N");
    }
    if (device_.is_cuda() && !torch::cuda::is_available())
      return Status::InvalidArgument("--device " + o_.device +
                                     ": this LibTorch or machine has no CUDA (use --device cpu)");
  }
  KILN_RETURN_IF_ERROR(ResolvePrecision(o_.precision, device_, &precision_));
  scaler_ = LossScaler(LossScalerOptions{precision_ == Precision::kFp16});

  // Caches: verified, and the validation cache preprocessed like the training one.
  KILN_RETURN_IF_ERROR(OpenCache(o_.data, o_.verify, &train_));
  const Manifest& m = train_->manifest();
  if (m.shape.ndim != 3)
    return Status::InvalidArgument(o_.data + ": records of shape [C, H, W] are needed to train " +
                                   "on (this cache's have " + std::to_string(m.shape.ndim) +
                                   " dimensions)");
  classes_ = static_cast<int64_t>(m.classes.size());
  if (classes_ < 2)
    return Status::InvalidArgument(o_.data + ": the manifest lists " + std::to_string(classes_) +
                                   " class(es); classification needs at least 2");
  sample_shape_ = {m.shape.dims[0], m.shape.dims[1], m.shape.dims[2]};
  if (o_.crop > 0) sample_shape_[1] = sample_shape_[2] = o_.crop;
  if (!o_.val.empty()) {
    KILN_RETURN_IF_ERROR(OpenCache(o_.val, o_.verify, &val_));
    auto diff = PreprocessingDifferences(m, val_->manifest());
    if (val_->manifest().classes != m.classes)
      diff.push_back("classes: the two caches list different class names");
    if (!diff.empty()) {
      std::string all;
      for (const auto& d : diff) all += "\n  " + d;
      if (!o_.allow_mismatch)
        return Status::InvalidArgument(
            "the validation cache " + o_.val + " was preprocessed differently from " + o_.data +
            " (training vs validation):" + all +
            "\nRebuild one of them with the other's options, or pass --allow-mismatch");
      out_ << "warning: --allow-mismatch: validation cache differs from the training cache:" << all
           << "\n";
    }
  }
  if (!o_.metrics.empty() && lead()) {
    metrics_.open(o_.metrics, o_.resume.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics_) return Status::IOError(o_.metrics + ": cannot open for writing");
  }
  return Status::OK();
}

Status Trainer::BuildModel() {
  const bool builtin = o_.model.size() < 3 || o_.model.substr(o_.model.size() - 3) != ".pt";
  if (builtin) {
    ModelSpec spec{o_.model, sample_shape_[0], sample_shape_[1], sample_shape_[2], classes_, o_.seed};
    KILN_RETURN_IF_ERROR(Model::Build(spec, &model_));
  } else {
    KILN_RETURN_IF_ERROR(Model::Load(o_.model, &model_));
  }
  if (!o_.init.empty()) {
    InitReport r;
    KILN_RETURN_IF_ERROR(model_.InitFrom(o_.init, &r));
    out_ << "init   from " << o_.init << ": " << r.loaded.size() << " tensors loaded, "
         << r.skipped.size() << " skipped, " << r.fresh.size() << " newly initialized\n";
    for (const auto& s : r.skipped) out_ << "  skipped " << s << "\n";
    for (const auto& s : r.fresh) out_ << "  new     " << s << "\n";
  }
  if (o_.replace_head) {
    KILN_RETURN_IF_ERROR(model_.ReplaceHead(classes_, o_.seed));
    out_ << "head   " << model_.head() << " replaced: " << classes_ << " outputs\n";
  }
  if (!o_.freeze.empty() || !o_.freeze_until.empty()) {
    std::vector<std::string> frozen;
    KILN_RETURN_IF_ERROR(model_.Freeze(o_.freeze, o_.freeze_until, &frozen));
    out_ << "freeze " << frozen.size() << " parameter tensors frozen (first "
         << (frozen.empty() ? "-" : frozen.front()) << ", last "
         << (frozen.empty() ? "-" : frozen.back()) << ")\n";
  }
  model_.To(device_);
  double macs = 0;
  int64_t outputs = 0;
  KILN_RETURN_IF_ERROR(model_.Probe(sample_shape_, &macs, &outputs).WithContext("model " + o_.model));
  if (outputs != classes_)
    return Status::InvalidArgument("model " + o_.model + " gives " + std::to_string(outputs) +
                                   " outputs but " + o_.data + " has " + std::to_string(classes_) +
                                   " classes; pass --replace-head to give its final layer (" +
                                   (model_.head().empty() ? "none found" : model_.head()) +
                                   ") the cache's classes");
  const int64_t params = model_.CountParameters(false), trainable = model_.CountParameters(true);
  if (trainable == 0)
    return Status::InvalidArgument("every parameter is frozen: nothing to train (check --freeze)");
  out_ << "model  " << o_.model << (builtin ? " (built in)" : " (TorchScript)") << " for "
       << sample_shape_[0] << "x" << sample_shape_[1] << "x" << sample_shape_[2] << ", "
       << classes_ << " classes: " << Thousands(params) << " parameters, " << Thousands(trainable)
       << " trainable, " << Fixed(macs / 1e6, 1) << " M multiply-adds per sample; model on "
       << model_.device().str() << "\n";
  for (const auto& [name, p] : model_.Parameters(true)) trainable_.push_back(p);
  if (dist_) {  // every rank starts from rank 0's weights
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> all;
    for (auto& [n, t] : model_.Parameters(false)) all.push_back(t);
    for (auto& [n, t] : model_.Buffers()) all.push_back(t);
    dist_->Broadcast(all);
  }
  return Status::OK();
}

// Training: seeded shuffle, whole batches only, random crop/flip.
// Evaluation: sequential, every sample, center crop.
TensorLoaderOptions Trainer::LoaderFor(int64_t batch, bool train) const {
  TensorLoaderOptions lo;
  lo.loader.batch_size = static_cast<uint64_t>(batch);
  lo.loader.workers = o_.workers;
  lo.loader.seed = o_.seed;
  lo.loader.shuffle = train;
  lo.loader.drop_last = train;
  lo.loader.crop = o_.crop;
  lo.loader.random_crop = train && o_.crop > 0;
  lo.loader.random_flip = train && o_.flip;
  if (dist_ && train) {  // DistributedSampler's share; evaluation runs on rank 0 alone
    lo.loader.rank = dist_->rank();
    lo.loader.world_size = dist_->world();
  }
  lo.slots = o_.workers + 2;
  lo.device = device_;
  lo.channels_last = o_.channels_last;
  return lo;
}

BatchTrial Trainer::Trial(int64_t batch) {
  BatchTrial t;
  t.batch = batch;
  // Weights and BatchNorm statistics are put back afterwards: trials do not train.
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
      torch::Tensor logits;
      {
        AutocastGuard amp(device_, precision_);
        logits = model_.Forward(x);
      }
      torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y).backward();
      for (auto& p : trainable_) p.mutable_grad() = torch::Tensor();
      if (device_.is_cuda()) torch::cuda::synchronize();
    }
    if (t.error.ok()) t.samples_per_second = batch * kTimed / std::max(1e-9, Seconds(t0));
    int64_t used = 0, total = 0;
    if (device_.is_cpu()) t.peak_bytes = PeakMemoryBytes();
    else if (GpuMemory(&used, &total)) t.peak_bytes = used;
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
  const bool gpu_measured = device_.is_cuda() && GpuMemory(&gpu_used, &gpu_total);
  if (budget == 0 && device_.is_cpu()) budget = PhysicalMemoryBytes() / 2;
  if (budget == 0 && gpu_measured) budget = gpu_total / 10 * 9;
  const int64_t samples = static_cast<int64_t>(train_->size());
  const int64_t max_batch = std::min<int64_t>(o_.max_batch, samples / o_.accum_steps);
  const int64_t first = std::min<int64_t>(32, std::max<int64_t>(1, max_batch));
  std::vector<BatchTrial> table;
  Status s = SearchBatchSize(first, max_batch, budget, [this](int64_t b) { return Trial(b); },
                             &batch_, &table);
  out_ << "batch  automatic batch size (" << (device_.is_cpu() ? "peak RSS" : "peak memory")
       << ", budget " << (budget > 0 ? Fixed(budget / 1e6, 0) + " MB" : std::string("none")) << "):\n"
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

Status Trainer::MakeOptimizer() {
  const int64_t ranks = dist_ ? dist_->world() : 1;
  const int64_t effective = batch_ * o_.accum_steps * ranks;
  double factor = 1;
  if (o_.lr_scaling == "linear") factor = static_cast<double>(effective) / o_.base_batch;
  if (o_.lr_scaling == "sqrt") factor = std::sqrt(static_cast<double>(effective) / o_.base_batch);
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
    if (o_.optimizer == "adamw")
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
  if (o_.optimizer == "adamw")
    opt_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lr));
  else
    opt_ = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lr));
  out_ << "optim  " << o_.optimizer << ", lr " << lr;
  if (!head.empty()) out_ << " (head " << lr_head << ")";
  if (factor != 1) out_ << " (" << o_.lr_scaling << " scaling x" << Fixed(factor, 3) << ")";
  out_ << ", " << o_.schedule << " schedule; batch " << batch_ << " x " << o_.accum_steps
       << " accumulation" << (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : std::string())
       << " = " << effective << " per step; precision " << PrecisionName(precision_)
       << " on " << device_.str() << "\n";
  return Status::OK();
}

// The options a checkpoint must be continued with, by option name: those
// that decide the model, the sample order and augmentation (WORLD_SIZE
// shares each epoch among the ranks), and the optimizer's state, which
// optimizer.pt holds per group by position. --batch-size is the one used
// (chosen, when automatic) in a checkpoint, and only an explicit one is
// compared. Everything else may change on resume: --epochs to extend the
// training, --lr and the schedule, logging and outputs, threads.
json Trainer::Settings() const {
  json s = {{"--model", o_.model},
            {"--seed", o_.seed},
            {"--crop", o_.crop},
            {"--flip", o_.flip},
            {"--freeze", o_.freeze},
            {"--freeze-until", o_.freeze_until},
            {"--lr-head", o_.lr_head},
            {"--optimizer", o_.optimizer},
            {"--accum-steps", o_.accum_steps},
            {"WORLD_SIZE", dist_ ? dist_->world() : 1}};
  if (batch_ > 0) s["--batch-size"] = batch_;
  else if (o_.batch_size > 0) s["--batch-size"] = o_.batch_size;
  return s;
}

// Finds and reads the --resume checkpoint and refuses settings other than
// its own, before the model is built.
Status Trainer::ReadResume() {
  if (o_.resume.empty()) return Status::OK();
  bool fallback = false;
  KILN_RETURN_IF_ERROR(FindCheckpoint(o_.resume, &resume_dir_, &fallback).WithContext("--resume"));
  if (fallback)
    out_ << "resume " << o_.resume << " has no state.json: a save was stopped while replacing it; "
         << "using " << resume_dir_ << ", the newest complete checkpoint it left\n";
  KILN_RETURN_IF_ERROR(ReadCheckpointState(resume_dir_, &start_));
  const json now = Settings();
  for (const auto& [option, value] : now.items()) {
    if (!start_.settings.contains(option)) continue;  // an older checkpoint
    const json& then = start_.settings.at(option);
    // --lr-head's rate may change like --lr's; whether the head has an
    // optimizer group of its own may not.
    const bool same =
        option == "--lr-head"
            ? then.is_number() && (then.get<double>() >= 0) == (value.get<double>() >= 0)
            : then == value;
    if (!same)
      return Status::InvalidArgument("--resume " + o_.resume + ": made with " +
                                     Shown(option, then) + ", this run has " +
                                     Shown(option, value) +
                                     "; use the same options or start without --resume");
  }
  return Status::OK();
}

// The resumed checkpoint's weights, after the model is built.
Status Trainer::Resume() {
  if (o_.resume.empty()) return Status::OK();
  InitReport r;
  KILN_RETURN_IF_ERROR(model_.InitFrom(resume_dir_, &r));
  if (!r.fresh.empty())
    return Status::Corruption("--resume " + resume_dir_ + ": the checkpoint lacks " +
                              r.fresh.front() + " (" + std::to_string(r.fresh.size()) +
                              " tensors in all)");
  return Status::OK();
}

// The resumed checkpoint's optimizer, random generator, loss scaler and
// step, after the optimizer is made.
Status Trainer::RestoreOptimizer() {
  if (o_.resume.empty()) return Status::OK();
  // The settings check above covers the options; this catches the rest (a
  // TorchScript --model file whose parameters changed).
  if (!start_.groups.empty() && start_.groups != groups_)
    return Status::InvalidArgument(
        "--resume " + o_.resume + ": the checkpoint's optimizer state is for " +
        DescribeGroups(start_.groups) + ", this run optimizes " + DescribeGroups(groups_) +
        "; use the same --model, --freeze, --freeze-until and --lr-head, or start without "
        "--resume");
  try {
    torch::load(*opt_, (fs::path(resume_dir_) / "optimizer.pt").string());
    torch::Tensor rng;
    torch::load(rng, (fs::path(resume_dir_) / "rng.pt").string());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng);
  } catch (const c10::Error& e) {
    return Status::Corruption("--resume " + resume_dir_ + ": cannot restore the optimizer: " +
                              e.what_without_backtrace());
  }
  scaler_.Restore(start_.scale, start_.growth_tracker, start_.skipped);
  global_step_ = start_.global_step;
  out_ << "resume " << resume_dir_ << ": epoch " << start_.epoch + 1 << ", step "
       << start_.step_in_epoch << " of it, " << global_step_ << " steps done\n";
  return Status::OK();
}

Status Trainer::Save(const std::string& dir, int64_t epoch, int64_t step_in_epoch,
                     const EpochSoFar& so_far) {
  if (!lead()) return Status::OK();
  Checkpoint c;
  c.epoch = epoch;
  c.step_in_epoch = step_in_epoch;
  c.global_step = global_step_;
  c.scale = scaler_.scale();
  c.growth_tracker = scaler_.growth_tracker();
  c.skipped = scaler_.skipped_steps();
  c.batch_size = batch_;
  c.accum_steps = o_.accum_steps;
  c.model = o_.model;
  c.so_far = so_far;
  c.settings = Settings();
  c.groups = groups_;
  return SaveCheckpoint(dir, model_, *opt_, c);
}

void Trainer::Metric(const json& j) {
  if (metrics_.is_open()) metrics_ << j.dump() << "\n" << std::flush;
}

// One optimizer step: accum_steps micro-batches. Sets *epoch_end (and does
// no step) when the epoch has no full step left.
Status Trainer::Step(TensorLoader& loader, Meter& meter, bool* epoch_end, bool* stop) {
  *epoch_end = false;
  for (int k = 0; k < o_.accum_steps; ++k) {
    torch::Tensor x, y;
    Status s = loader.Next(&x, &y);
    if (s.IsNotFound()) {
      *epoch_end = true;
      return Status::OK();
    }
    KILN_RETURN_IF_ERROR(s);
    if (!first_batch_checked_) {
      KILN_RETURN_IF_ERROR(CheckSameDevice(model_, x));
      out_ << "data   first batch " << c10::str(x.sizes()) << " " << x.dtype() << " on "
           << x.device().str() << "\n";
      first_batch_checked_ = true;
    }
    torch::Tensor logits;
    {
      AutocastGuard amp(device_, precision_);
      logits = model_.Forward(x);
    }
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat),
        y, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(o_.label_smoothing));
    scaler_.Scale(loss / o_.accum_steps).backward();
    torch::NoGradGuard no_grad;
    meter.loss_sum += loss.detach().to(torch::kFloat64) * x.size(0);
    meter.correct += logits.argmax(1).eq(y).sum();
    meter.samples += x.size(0);
  }
  // Ctrl-C on any rank stops every rank after this same step.
  *stop = dist_ ? ReduceGradients(g_sigint.load() > 0) : g_sigint.load() > 0;
  const bool finite = scaler_.UnscaleAndCheck(trainable_);
  if (finite) opt_->step();
  scaler_.Update(!finite);
  opt_->zero_grad();
  return Status::OK();
}

bool Trainer::ReduceGradients(bool stop_here) {
  std::vector<torch::Tensor> flat;
  for (auto& p : trainable_) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    flat.push_back(p.grad().reshape({-1}));
  }
  const auto opts = flat.empty() ? torch::TensorOptions() : flat[0].options();
  flat.push_back(torch::full({1}, stop_here ? 1.0 : 0.0, opts));
  torch::Tensor buf = torch::cat(flat);
  dist_->AllReduceSum(buf);
  buf.div_(dist_->world());
  int64_t off = 0;
  for (auto& p : trainable_) {
    const int64_t n = p.numel();
    p.mutable_grad().copy_(buf.narrow(0, off, n).view_as(p));
    off += n;
  }
  return buf[off].item<double>() > 0;
}

void Trainer::ReduceMeter(Meter* m) {
  torch::Tensor t = torch::stack({m->loss_sum.to(torch::kCPU, torch::kFloat64),
                                  m->correct.to(torch::kCPU, torch::kFloat64),
                                  torch::tensor(static_cast<double>(m->samples), torch::kFloat64)});
  dist_->AllReduceSum(t);
  m->loss_sum = t[0].to(device_);
  m->correct = t[1].to(device_);
  m->samples = static_cast<int64_t>(t[2].item<double>());
}

Status Trainer::Evaluate(EpochStats* stats) {
  std::unique_ptr<TensorLoader> loader;
  KILN_RETURN_IF_ERROR(
      TensorLoader::Open(val_.get(), LoaderFor(std::max<int64_t>(batch_, 64), /*train=*/false), &loader)
          .WithContext(o_.val));
  KILN_RETURN_IF_ERROR(loader->StartEpoch(0));
  model_.SetTraining(false);
  torch::NoGradGuard no_grad;
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device_);
  torch::Tensor loss_sum = torch::zeros({}, f64), top1 = torch::zeros({}, f64),
                top5 = torch::zeros({}, f64);
  int64_t n = 0;
  for (;;) {
    torch::Tensor x, y;
    Status s = loader->Next(&x, &y);
    if (s.IsNotFound()) break;
    KILN_RETURN_IF_ERROR(s);
    torch::Tensor logits;
    {
      AutocastGuard amp(device_, precision_);
      logits = model_.Forward(x);
    }
    logits = logits.to(torch::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, y,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .to(torch::kFloat64);
    top1 += logits.argmax(1).eq(y).sum();
    if (classes_ >= 5) top5 += std::get<1>(logits.topk(5, 1)).eq(y.unsqueeze(1)).any(1).sum();
    n += x.size(0);
  }
  model_.SetTraining(true);
  if (n == 0) return Status::OK();
  stats->val_loss = loss_sum.item<double>() / n;
  stats->val_top1 = top1.item<double>() / n;
  stats->val_top5 = classes_ >= 5 ? top5.item<double>() / n : -1;
  return Status::OK();
}

Status Trainer::Run(TrainResult* result) {
  SigintScope sigint;
  KILN_RETURN_IF_ERROR(Setup());
  KILN_RETURN_IF_ERROR(ReadResume());
  KILN_RETURN_IF_ERROR(BuildModel());
  KILN_RETURN_IF_ERROR(Resume());
  KILN_RETURN_IF_ERROR(ChooseBatchSize());
  KILN_RETURN_IF_ERROR(MakeOptimizer());
  KILN_RETURN_IF_ERROR(RestoreOptimizer());
  result->batch_size = batch_;
  result->optimized = optimized_;

  std::unique_ptr<TensorLoader> loader;
  KILN_RETURN_IF_ERROR(
      TensorLoader::Open(train_.get(), LoaderFor(batch_, /*train=*/true), &loader).WithContext(o_.data));
  const int64_t steps_per_epoch =
      static_cast<int64_t>(loader->loader().batches_per_epoch()) / o_.accum_steps;
  if (steps_per_epoch == 0)
    return Status::InvalidArgument(o_.data + " has " + std::to_string(train_->size()) +
                                   " samples: not one step of batch " + std::to_string(batch_) +
                                   " x " + std::to_string(o_.accum_steps) +
                                   "; lower --batch-size or --accum-steps");
  const int64_t total_steps = steps_per_epoch * o_.epochs;
  const std::string interrupt_dir = o_.save.empty() ? "kiln-checkpoint" : o_.save;

  for (int64_t epoch = start_.epoch; epoch < o_.epochs; ++epoch) {
    const int64_t first_step = epoch == start_.epoch ? start_.step_in_epoch : 0;
    KILN_RETURN_IF_ERROR(
        loader->StartEpoch(static_cast<uint64_t>(epoch), static_cast<uint64_t>(first_step * o_.accum_steps)));
    (void)loader->TakeWaitSeconds();
    model_.SetTraining(true);
    Meter epoch_meter, log_meter;
    epoch_meter.Reset(device_);
    log_meter.Reset(device_);
    // Resumed inside this epoch: its part before the checkpoint counts too,
    // so the epoch's loss and accuracy are the uninterrupted run's. Its
    // seconds are added as well, so samples/s and the data-wait share cover
    // the whole epoch's training time (not the time between the
    // interruption and the resume, nor this run's start-up).
    double seconds_before = 0, wait_epoch = 0;
    if (epoch == start_.epoch && first_step > 0) {
      seconds_before = start_.so_far.seconds;
      wait_epoch = start_.so_far.wait_seconds;
      if (lead()) {  // sums over all ranks already: the others add zeros
        torch::NoGradGuard no_grad;
        epoch_meter.loss_sum.fill_(start_.so_far.loss_sum);
        epoch_meter.correct.fill_(start_.so_far.correct);
        epoch_meter.samples = start_.so_far.samples;
      }
    }
    // The epoch so far for a mid-epoch checkpoint, from `all` (summed over
    // the ranks).
    auto so_far = [](const Meter& all, double seconds, double wait) {
      EpochSoFar e;
      e.loss_sum = all.loss_sum.item<double>();
      e.correct = all.correct.item<int64_t>();
      e.samples = all.samples;
      e.seconds = seconds;
      e.wait_seconds = wait;
      return e;
    };
    auto t_epoch = std::chrono::steady_clock::now(), t_log = t_epoch;
    int64_t step = first_step;
    bool stopped = false;
    for (; step < steps_per_epoch; ++step) {
      if (o_.max_steps > 0 && global_step_ >= o_.max_steps) {
        stopped = true;
        break;
      }
      const double lr_factor = ScheduledLr(o_, 1.0, global_step_, steps_per_epoch, total_steps);
      for (size_t g = 0; g < opt_->param_groups().size(); ++g)
        opt_->param_groups()[g].options().set_lr(base_lr_[g] * lr_factor);
      Meter m;
      m.Reset(device_);
      bool epoch_end = false, stop = false;
      KILN_RETURN_IF_ERROR(Step(*loader, m, &epoch_end, &stop));
      if (epoch_end) break;
      ++global_step_;
      {
        torch::NoGradGuard no_grad;
        log_meter.loss_sum += m.loss_sum;
        log_meter.correct += m.correct;
        epoch_meter.loss_sum += m.loss_sum;
        epoch_meter.correct += m.correct;
      }
      log_meter.samples += m.samples;
      epoch_meter.samples += m.samples;
      if (o_.log_every > 0 && (step + 1) % o_.log_every == 0) {
        const double loss = log_meter.loss_sum.item<double>() / log_meter.samples;
        const double acc = log_meter.correct.item<double>() / log_meter.samples;
        const double rate = log_meter.samples / std::max(1e-9, Seconds(t_log));
        out_ << "epoch " << epoch + 1 << " step " << step + 1 << "/" << steps_per_epoch << "  loss "
             << Fixed(loss, 4) << "  acc " << Fixed(100 * acc, 2) << "%  lr "
             << base_lr_[0] * lr_factor << "  " << Fixed(rate, 0) << " samples/s\n";
        Metric({{"kind", "step"}, {"epoch", epoch + 1}, {"step", global_step_},
                {"loss", loss}, {"acc", acc}, {"lr", base_lr_[0] * lr_factor},
                {"samples_per_s", rate}, {"loss_scale", scaler_.scale()}});
        log_meter.Reset(device_);
        t_log = std::chrono::steady_clock::now();
      }
      if (stop) {
        wait_epoch += loader->TakeWaitSeconds();
        Meter all = epoch_meter;  // ReduceMeter gives `all` new tensors
        if (dist_) ReduceMeter(&all);
        KILN_RETURN_IF_ERROR(Save(interrupt_dir, epoch, step + 1,
                                  so_far(all, seconds_before + Seconds(t_epoch), wait_epoch)));
        out_ << "interrupted: checkpoint saved to " << interrupt_dir << " (epoch " << epoch + 1
             << ", step " << step + 1 << "); continue with the same command and --resume "
             << interrupt_dir << "\n";
        result->interrupted = true;
        result->checkpoint = interrupt_dir;
        result->steps = global_step_;
        result->skipped_steps = scaler_.skipped_steps();
        return Status::OK();
      }
    }
    if (device_.is_cuda()) torch::cuda::synchronize();
    EpochStats es;
    es.epoch = static_cast<int>(epoch + 1);
    es.seconds = seconds_before + Seconds(t_epoch);
    es.data_wait_seconds = wait_epoch + loader->TakeWaitSeconds();
    if (dist_) ReduceMeter(&epoch_meter);
    es.samples_per_second = epoch_meter.samples / std::max(1e-9, es.seconds);
    if (epoch_meter.samples > 0) {
      es.train_loss = epoch_meter.loss_sum.item<double>() / epoch_meter.samples;
      es.train_acc = epoch_meter.correct.item<double>() / epoch_meter.samples;
    }
    if (stopped) {
      // --max-steps: a checkpoint at this exact point, to resume mid-epoch.
      if (!o_.save.empty()) {
        KILN_RETURN_IF_ERROR(
            Save(o_.save, epoch, step, so_far(epoch_meter, es.seconds, es.data_wait_seconds)));
        result->checkpoint = o_.save;
      }
      out_ << "stopped after " << global_step_ << " steps (--max-steps)\n";
      if (epoch_meter.samples > 0) result->epochs.push_back(es);
      break;
    }
    if (val_ && lead()) KILN_RETURN_IF_ERROR(Evaluate(&es));
    if (dist_) dist_->Barrier();
    const double share = es.seconds > 0 ? es.data_wait_seconds / es.seconds : 0;
    out_ << "epoch " << es.epoch << "/" << o_.epochs << " done in " << Fixed(es.seconds, 1)
         << " s: train loss " << Fixed(es.train_loss, 4) << ", acc " << Fixed(100 * es.train_acc, 2)
         << "%";
    if (es.val_top1 >= 0) {
      out_ << "; val loss " << Fixed(es.val_loss, 4) << ", top-1 " << Fixed(100 * es.val_top1, 2)
           << "%";
      if (es.val_top5 >= 0) out_ << ", top-5 " << Fixed(100 * es.val_top5, 2) << "%";
    }
    out_ << "\n  " << Fixed(es.samples_per_second, 0) << " samples/s; waited for data "
         << Fixed(100 * share, 1) << "% of the epoch: "
         << (share > 0.10 ? "input is the bottleneck - more --workers, a uint8 cache or a smaller "
                            "stored size would help"
                          : "input is not the bottleneck")
         << "\n";
    json ej = {{"kind", "epoch"},          {"epoch", es.epoch},
               {"step", global_step_},     {"train_loss", es.train_loss},
               {"train_acc", es.train_acc}, {"seconds", es.seconds},
               {"data_wait_share", share}, {"samples_per_s", es.samples_per_second}};
    if (es.val_top1 >= 0) {
      ej["val_loss"] = es.val_loss;
      ej["val_top1"] = es.val_top1;
      if (es.val_top5 >= 0) ej["val_top5"] = es.val_top5;
    }
    Metric(ej);
    result->epochs.push_back(es);
    if (!o_.save.empty()) {
      KILN_RETURN_IF_ERROR(Save(o_.save, epoch + 1, 0));
      result->checkpoint = o_.save;
    }
  }
  result->steps = global_step_;
  result->skipped_steps = scaler_.skipped_steps();
  if (!o_.export_path.empty() && lead()) {
    model_.SetTraining(false);
    KILN_RETURN_IF_ERROR(model_.Save(o_.export_path));
    out_ << "export " << o_.export_path << " (TorchScript, eval mode; torch.jit.load it)\n";
  }
  return Status::OK();
}

}  // namespace

Status Train(const TrainOptions& options, TrainResult* result) {
  TrainResult local;
  try {
    Trainer t(options);
    Status s = t.Run(&local);
    if (result) *result = std::move(local);
    return s;
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    if (c10_error != nullptr && IsOutOfMemory(*c10_error))
      return Status::InvalidArgument(
          std::string("training ran out of memory: lower --batch-size (--accum-steps keeps the "
                      "effective batch) or use --batch-size auto; LibTorch said: ") +
          std::string(c10_error->what_without_backtrace()).substr(0, 1000));
    // TorchScript errors carry an interpreter traceback; the last line says
    // what failed (after LibTorch's C++ backtrace, which is dropped).
    std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
    size_t end = what.find_last_not_of(" \n");
    size_t start = end == std::string::npos ? std::string::npos : what.rfind('\n', end);
    if (start != std::string::npos) what = what.substr(start + 1, end - start);
    return Status::InvalidArgument("training failed in LibTorch: " + what.substr(0, 2000));
  }
}

}  // namespace kiln::train
