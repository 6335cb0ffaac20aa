// Start-up of kiln train: option checks, the device, the caches (verified),
// the model and the loader options.
#include <cmath>
#include <cstdlib>

#include "collective.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "trainer_internal.h"

namespace kiln::train::internal {
namespace {

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

}  // namespace

Status Trainer::Setup() {
  if (o_.data.empty()) return Status::InvalidArgument("--data: give the training cache directory");
  if (o_.accum_steps < 1) return Status::InvalidArgument("--accum-steps must be at least 1");
  if (o_.epochs < 1) return Status::InvalidArgument("--epochs must be at least 1");
  if (o_.base_batch < 1)
    return Status::InvalidArgument("--base-batch " + std::to_string(o_.base_batch) +
                                   ": must be at least 1 (the batch size --lr was chosen for)");
  // Launched like torchrun: one process per rank, rank 0 logs and saves;
  // each rank's device is chosen first, as its backend follows it (NCCL
  // for a GPU), and stays the current device while training.
  if (o_.dist_timeout < 1)
    return Status::InvalidArgument("--dist-timeout " + std::to_string(o_.dist_timeout) +
                                   ": must be at least 1 second");
  Launch launch;
  KILN_RETURN_IF_ERROR(ReadLaunch(&launch));
  KILN_RETURN_IF_ERROR(
      ChooseDevice(o_.device, launch, static_cast<int64_t>(torch::cuda::device_count()), &device_));
  if (device_.is_cuda()) device_guard_.reset_device(device_);
  std::string joined;
  KILN_RETURN_IF_ERROR(JoinFromEnvironment(launch, device_, o_.dist_timeout, &dist_, &joined));
  if (dist_) {
    if (!lead()) out_.rdbuf(&null_buffer_);
    out_ << "dist   " << joined << ": each rank trains on its share of every epoch\n";
  }
  if (!o_.save.empty() && lead()) KILN_RETURN_IF_ERROR(CheckSaveLocation(o_.save));
  ring_ = std::make_shared<HostRing>(device_);
  // Threads: --threads, else on the CPU kiln's choice (DefaultCpuThreads).
  const bool choose_threads = o_.threads <= 0 && device_.is_cpu();
  if (o_.threads > 0 || choose_threads)
    torch::set_num_threads(o_.threads > 0 ? o_.threads : DefaultCpuThreads());
  out_ << "cpu    threads " << torch::get_num_threads() << " intra-op ("
       << (o_.threads > 0 ? "--threads" : choose_threads ? "one per usable CPU" : "LibTorch's default")
       << "), " << torch::get_num_interop_threads() << " inter-op; " << o_.workers
       << " loader workers; OpenMP waits: OMP_WAIT_POLICY="
       << (std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "unset (spinning)")
       << "; malloc: GLIBC_TUNABLES="
       << (std::getenv("GLIBC_TUNABLES") ? std::getenv("GLIBC_TUNABLES")
                                         : "unset (glibc's defaults)")
       << "\n";
  KILN_RETURN_IF_ERROR(ResolvePrecision(o_.precision, device_, &precision_, &precision_why_));
  LossScalerOptions so;
  so.enabled = precision_ == Precision::kFp16;
  so.device = device_;
  scaler_ = LossScaler(so);

  // Caches: verified, and the validation cache preprocessed like the training one.
  KILN_RETURN_IF_ERROR(OpenCache(o_.data, o_.verify, &train_));
  const Manifest& m = train_->manifest();
  const FieldSpec& image = m.fields[m.image_field];
  const bool whole = !image.fixed();
  rrc_ = o_.augment == "rrc" || (o_.augment == "auto" && whole);
  if (whole && !rrc_)
    return Status::NotSupported(o_.data + ": its images are stored whole, each at its own size (" +
                                image.ShapeText() +
                                "); --augment none cuts a window of records of one size: train "
                                "with --augment rrc (RandomResizedCrop), or build the cache with "
                                "--resize and --crop");
  if (!o_.res_schedule.empty()) {
    KILN_RETURN_IF_ERROR(
        ParseResolutionSchedule(o_.res_schedule, &res_).WithContext("--res-schedule"));
    if (!rrc_)
      return Status::InvalidArgument(
          "--res-schedule changes the RandomResizedCrop size between "
          "epochs: it needs --augment rrc (the default on a cache of "
          "whole images)");
  }
  crop_ = o_.crop > 0 || !res_.enabled() ? o_.crop : res_.max_res;  // the evaluation size
  train_crop_ = res_.enabled() ? res_.max_res : crop_;
  if (rrc_ && crop_ == 0)
    return Status::InvalidArgument(
        "--augment rrc needs --crop N, the size each sample is resized "
        "to (224 in torchvision's ImageNet recipe)");
  if (image.ndim != 3)
    return Status::InvalidArgument(o_.data + ": records of shape [C, H, W] are needed to train " +
                                   "on (this cache's have " + std::to_string(image.ndim) +
                                   " dimensions)");
  if (m.label_field < 0)
    return Status::NotSupported(
        o_.data + ": the cache has no label field of one class index per record (its fields: " +
        [&m] {
          std::string names;
          for (const FieldSpec& f : m.fields) names += (names.empty() ? "" : ", ") + f.name;
          return names;
        }() +
        "); kiln train trains single-label classifiers - train on several labels or targets "
        "from Python with kiln.Cache");
  classes_ = static_cast<int64_t>(m.classes.size());
  if (classes_ < 2)
    return Status::InvalidArgument(o_.data + ": the manifest lists " + std::to_string(classes_) +
                                   " class(es); classification needs at least 2");
  if (!o_.val.empty()) {
    KILN_RETURN_IF_ERROR(OpenCache(o_.val, o_.verify, &val_));
    // Evaluation's Resize: the cache's own shorter side when it stores
    // whole images at one (then the centre crop is exact), else
    // torchvision's ImageNet ratio, crop / 0.875 (256 for 224).
    const Preprocessing& vp = val_->manifest().preprocessing;
    val_resize_ = vp.whole && vp.resize > 0 ? static_cast<uint32_t>(vp.resize)
                                            : static_cast<uint32_t>(std::lround(crop_ / 0.875));
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
  Shape shape;
  KILN_RETURN_IF_ERROR(LoaderOutputShape(m, LoaderFor(1, true).loader, &shape)
                           .WithContext("--crop/--augment on " + o_.data));
  sample_shape_ = {shape.dims[0], shape.dims[1], shape.dims[2]};
  if (rrc_) {
    out_ << "augment RandomResizedCrop(";
    if (res_.enabled())
      out_ << res_.min_res << " up to epoch " << res_.start_ramp << ", then steps of " << res_.step
           << " to " << res_.max_res << " from epoch " << res_.end_ramp;
    else
      out_ << crop_;
    out_ << ", scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip, at load time";
    if (val_) out_ << "; --val: Resize(" << val_resize_ << ") + CenterCrop(" << crop_ << ")";
    out_ << "\n";
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
    // The file's random layers (dropout) draw from LibTorch's default
    // generator, which Model::Build seeds for a built-in model: --seed
    // decides them here too (unseeded, two runs of the same command
    // differed by a point of top-1 after one epoch).
    torch::manual_seed(o_.seed);
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
  if (res_.enabled()) {  // every size the schedule will train at, before any epoch runs
    uint32_t tried = res_.max_res;
    for (int64_t e = 0; e < o_.epochs; ++e) {
      const uint32_t r = ResolutionAt(res_, e);
      if (r == tried) continue;
      tried = r;
      double m = 0;
      int64_t n = 0;
      const Status s = model_.Probe({sample_shape_[0], r, r}, &m, &n);
      if (!s.ok())
        return Status::InvalidArgument("model " + o_.model + " cannot take the " +
                                       std::to_string(r) + "x" + std::to_string(r) +
                                       " inputs --res-schedule gives epoch index " +
                                       std::to_string(e) + " (" + s.message() +
                                       "); use a model with adaptive pooling, such as cnn or a "
                                       "resnet, or train at one size");
    }
  }
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
  lo.loader.crop = train ? train_crop_ : crop_;
  if (train && res_.enabled()) lo.loader.max_crop = res_.max_res;  // the ring's size
  lo.loader.random_crop = train && crop_ > 0;
  lo.loader.random_flip = train && o_.flip;
  if (rrc_) {  // torchvision's ImageNet recipe
    lo.loader.crop_kind = train ? CropKind::kRandomResized : CropKind::kResizeCenter;
    lo.loader.random_crop = false;
    lo.loader.random_flip = train;
    lo.loader.resize = train ? 0 : val_resize_;
  }
  if (dist_) {  // DistributedSampler's share; evaluation's padding is not counted (Evaluate)
    lo.loader.rank = dist_->rank();
    lo.loader.world_size = dist_->world();
  }
  lo.slots = o_.workers + 2;
  lo.device = device_;
  lo.channels_last = o_.channels_last;
  lo.ring = ring_;
  return lo;
}

}  // namespace kiln::train::internal
