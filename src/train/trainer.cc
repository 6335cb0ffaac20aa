// kiln train's loop: Train(), the epochs (Trainer::Run), one optimizer step
// and the evaluation. The other parts of the Trainer are listed in
// trainer_internal.h.
#include "kiln/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>

#include "core/units.h"
#include "trainer_internal.h"

namespace kiln::train {
namespace internal {
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

}  // namespace

void Trainer::Metric(const json& j) {
  if (metrics_.is_open()) metrics_ << j.dump() << "\n" << std::flush;
}

void Trainer::ForwardBackward(const torch::Tensor& x, const torch::Tensor& y, Meter* meter) {
  clock_.Restart();
  torch::Tensor logits;
  {
    AutocastGuard amp(device_, precision_);
    logits = model_.Forward(x);
  }
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat), y,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(o_.label_smoothing));
  clock_.Lap(&phases_.forward);
  scaler_.Scale(loss / o_.accum_steps).backward();
  clock_.Lap(&phases_.backward);
  if (meter == nullptr) return;
  torch::NoGradGuard no_grad;
  meter->loss_sum += loss.detach().to(torch::kFloat64) * x.size(0);
  meter->correct += logits.argmax(1).eq(y).sum();
  meter->samples += x.size(0);
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
           << x.device().str() << "; host ring " << o_.workers + 2 << " slots, "
           << Fixed(ring_->bytes() / 1e6, 1) << " MB" << (ring_->pinned() ? " pinned" : "") << "\n";
      first_batch_checked_ = true;
    }
    // The last micro-batch's backward starts the gradient all-reduce.
    if (reducer_ && k + 1 == o_.accum_steps) reducer_->Arm();
    ForwardBackward(x, y, &meter);
  }
  // Ctrl-C on any rank stops every rank after this same step.
  clock_.Restart();
  *stop = reducer_ ? reducer_->Finish(g_sigint.load() > 0) : g_sigint.load() > 0;
  const bool finite = scaler_.UnscaleAndCheck(trainable_);
  if (finite) opt_->step();
  scaler_.Update(!finite);
  opt_->zero_grad();
  clock_.Lap(&phases_.optimizer);
  return Status::OK();
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
      TensorLoader::Open(val_.get(), LoaderFor(EvalBatch(), /*train=*/false), &loader)
          .WithContext(o_.val));
  KILN_RETURN_IF_ERROR(loader->StartEpoch(0));
  model_.SetTraining(false);
  torch::NoGradGuard no_grad;
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device_);
  torch::Tensor loss_sum = torch::zeros({}, f64), top1 = torch::zeros({}, f64),
                top5 = torch::zeros({}, f64);
  int64_t n = 0;
  // Distributed, rank r of W takes positions r, r+W, ... of the records,
  // padded at the end by wrap-around: only its first `real` samples are
  // records of its own, the rest repeat other ranks' and are not counted.
  const int64_t count = static_cast<int64_t>(val_->size());
  const int64_t rank = dist_ ? dist_->rank() : 0, world = dist_ ? dist_->world() : 1;
  const int64_t real = rank < count ? (count - rank + world - 1) / world : 0;
  for (;;) {
    torch::Tensor x, y;
    Status s = loader->Next(&x, &y);
    if (s.IsNotFound()) break;
    KILN_RETURN_IF_ERROR(s);
    const int64_t keep = std::min<int64_t>(x.size(0), real - n);
    if (keep <= 0) continue;
    if (keep < x.size(0)) {
      x = x.narrow(0, 0, keep);
      y = y.narrow(0, 0, keep);
    }
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
  if (dist_) {
    torch::Tensor sums = torch::stack({loss_sum.to(torch::kCPU), top1.to(torch::kCPU, torch::kFloat64),
                                       top5.to(torch::kCPU, torch::kFloat64),
                                       torch::tensor(static_cast<double>(n), torch::kFloat64)});
    dist_->AllReduceSum(sums);
    loss_sum = sums[0];
    top1 = sums[1];
    top5 = sums[2];
    n = static_cast<int64_t>(sums[3].item<double>());
  }
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
  result->intra_op_threads = torch::get_num_threads();
  result->optimized = optimized_;
  if (dist_) reducer_ = std::make_unique<GradReducer>(dist_.get(), trainable_);

  // One host ring for the training and the evaluation loaders, which take
  // turns: the training loader is closed while the model is evaluated.
  int64_t slot_bytes = 0, slot_labels = 0;
  TensorLoader::SlotSize(train_.get(), LoaderFor(batch_, true), &slot_bytes, &slot_labels);
  if (val_) {
    int64_t b = 0, l = 0;
    TensorLoader::SlotSize(val_.get(), LoaderFor(EvalBatch(), false), &b, &l);
    slot_bytes = std::max(slot_bytes, b);
    slot_labels = std::max(slot_labels, l);
  }
  ring_->Reserve(o_.workers + 2, slot_bytes, slot_labels);
  std::unique_ptr<TensorLoader> loader;
  auto open_loader = [&] {
    return TensorLoader::Open(train_.get(), LoaderFor(batch_, /*train=*/true), &loader)
        .WithContext(o_.data);
  };
  KILN_RETURN_IF_ERROR(open_loader());
  const int64_t steps_per_epoch =
      static_cast<int64_t>(loader->loader().batches_per_epoch()) / o_.accum_steps;
  if (steps_per_epoch == 0)
    return Status::InvalidArgument(o_.data + " has " + std::to_string(train_->size()) +
                                   " samples: not one step of batch " + std::to_string(batch_) +
                                   " x " + std::to_string(o_.accum_steps) +
                                   "; lower --batch-size or --accum-steps");
  const int64_t total_steps = steps_per_epoch * o_.epochs;
  if (o_.profile) clock_.Enable(device_);
  const std::string interrupt_dir = o_.save.empty() ? "kiln-checkpoint" : o_.save;

  // An elastic resume counts steps in this run's units from here: the
  // whole epochs before, plus the consumed samples in this run's steps, so
  // that the schedule goes on from the same point of the training.
  if (elastic_)
    global_step_ = start_.epoch * steps_per_epoch +
                   static_cast<int64_t>(start_consumed_) /
                       (batch_ * o_.accum_steps * (dist_ ? dist_->world() : 1));
  for (int64_t epoch = start_.epoch; epoch < o_.epochs; ++epoch) {
    // Resumed inside the epoch: after some of its steps, or at step 0 of an
    // epoch an elastic resume had begun after a skip.
    const bool resumed =
        epoch == start_.epoch && (start_.step_in_epoch > 0 || start_.epoch_skip > 0);
    // A resume continues its epoch at its step, after the epoch's skip; an
    // elastic one after the samples consumed, from this run's step 0.
    int64_t first_step = resumed && !elastic_ ? start_.step_in_epoch : 0;
    uint64_t skip = 0;
    if (epoch == start_.epoch)
      skip = elastic_ ? start_consumed_ : static_cast<uint64_t>(start_.epoch_skip);
    if (!loader) KILN_RETURN_IF_ERROR(open_loader());
    if (res_.enabled()) {  // --res-schedule: this epoch's crop size, in the ring sized for MAX
      const uint32_t res = ResolutionAt(res_, epoch);
      if (lead() && (res != train_crop_ || epoch == start_.epoch))
        out_ << "epoch " << epoch + 1 << "/" << o_.epochs << ": RandomResizedCrop size " << res
             << " (--res-schedule, epoch index " << epoch << ")\n";
      train_crop_ = res;
      KILN_RETURN_IF_ERROR(loader->SetResolution(res));
    }
    KILN_RETURN_IF_ERROR(loader->StartEpoch(
        static_cast<uint64_t>(epoch), static_cast<uint64_t>(first_step * o_.accum_steps), skip));
    epoch_now_ = epoch;
    epoch_skip_ = static_cast<int64_t>(skip);
    // This epoch's steps: fewer after a skip.
    const int64_t epoch_steps =
        static_cast<int64_t>(loader->loader().epoch_batches()) / o_.accum_steps;
    (void)loader->TakeWaitSeconds();
    phases_ = PhaseTimes();
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
    if (resumed) {
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
    for (; step < epoch_steps; ++step) {
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
        result->host_ring_allocations = ring_->allocations();
        return Status::OK();
      }
    }
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    EpochStats es;
    es.epoch = static_cast<int>(epoch + 1);
    const double run_seconds = Seconds(t_epoch), run_wait = loader->TakeWaitSeconds();
    es.seconds = seconds_before + run_seconds;
    es.data_wait_seconds = wait_epoch + run_wait;
    if (o_.profile) {
      es.forward_seconds = phases_.forward;
      es.backward_seconds = phases_.backward;
      es.optimizer_seconds = phases_.optimizer;
    }
    if (dist_) ReduceMeter(&epoch_meter);
    es.samples = epoch_meter.samples;
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
    // Every rank evaluates its share, so no rank waits on rank 0's
    // evaluation past --dist-timeout; the sums are all-reduced. The
    // evaluation loader takes the host ring from the training one.
    if (val_) {
      loader.reset();
      KILN_RETURN_IF_ERROR(Evaluate(&es));
    }
    if (dist_) dist_->Barrier();
    const double share = es.seconds > 0 ? es.data_wait_seconds / es.seconds : 0;
    out_ << "epoch " << es.epoch << "/" << o_.epochs << " done in " << FormatDuration(es.seconds)
         << ": train loss " << Fixed(es.train_loss, 4) << ", acc " << Fixed(100 * es.train_acc, 2)
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
    if (o_.profile && step > first_step) {
      // This run's part of the epoch (a resumed epoch's earlier part is not timed).
      const double n = static_cast<double>(step - first_step), ms = 1000 / n;
      const double rest = run_seconds - run_wait - phases_.forward - phases_.backward -
                          phases_.optimizer;
      out_ << "  profile: " << Fixed(run_seconds * ms, 1) << " ms per step = data wait "
           << Fixed(run_wait * ms, 1) << " + forward " << Fixed(phases_.forward * ms, 1)
           << " + backward " << Fixed(phases_.backward * ms, 1) << " + optimizer "
           << Fixed(phases_.optimizer * ms, 1) << " + other " << Fixed(rest * ms, 1) << "\n";
    }
    json ej = {{"kind", "epoch"},          {"epoch", es.epoch},
               {"step", global_step_},     {"train_loss", es.train_loss},
               {"train_acc", es.train_acc}, {"seconds", es.seconds},
               {"data_wait_share", share}, {"samples_per_s", es.samples_per_second}};
    if (o_.profile)
      ej["profile_seconds"] = {{"steps", step - first_step}, {"seconds", run_seconds},
                               {"data_wait", run_wait},      {"forward", phases_.forward},
                               {"backward", phases_.backward}, {"optimizer", phases_.optimizer}};
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
  result->host_ring_allocations = ring_->allocations();
  if (!o_.export_path.empty() && lead()) {
    model_.SetTraining(false);
    KILN_RETURN_IF_ERROR(model_.Save(o_.export_path));
    out_ << "export " << o_.export_path << " (TorchScript, eval mode; torch.jit.load it)\n";
  }
  if (!o_.export_state_dict.empty() && lead()) {
    KILN_RETURN_IF_ERROR(model_.SaveStateDict(o_.export_state_dict));
    out_ << "export " << o_.export_state_dict
         << " (state_dict: model.load_state_dict(torch.load(path)))\n";
  }
  return Status::OK();
}

}  // namespace internal

Status Train(const TrainOptions& options, TrainResult* result) {
  TrainResult local;
  try {
    internal::Trainer t(options);
    Status s = t.Run(&local);
    if (result) *result = std::move(local);
    return s;
  } catch (const DistributedError& e) {
    return Status::IOError(e.what());
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
