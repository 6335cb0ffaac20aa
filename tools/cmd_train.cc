// kiln train --data CACHE [--val CACHE] [options]: the LibTorch trainer.
// Only the option table lives here; kiln::train does the work (and this
// file does not include LibTorch).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "command.h"
#include "kiln/train/trainer.h"
#include "core/units.h"

namespace kiln::tools {
namespace {

struct TrainArgs {
  train::TrainOptions o;
  std::string batch = "128";
  std::string freeze;
  std::string memory_budget;
  // Named choices, parsed into o's enums by RunTrain.
  std::string optimizer = "sgd", schedule = "cosine", lr_scaling = "none", precision = "auto";
};

// The run's last line, on the rank that logs (rank 0, as torchrun's RANK
// says): its epochs, steps, time and samples/s in human units, and the last
// validation top-1.
void PrintSummary(const train::TrainResult& r) {
  const char* rank = std::getenv("RANK");
  if (r.epochs.empty() || (rank != nullptr && std::string(rank) != "0")) return;
  double seconds = 0, samples = 0;
  for (const train::EpochStats& e : r.epochs) {
    seconds += e.seconds;
    samples += e.samples_per_second * e.seconds;
  }
  std::cout << "kiln train: " << r.epochs.size() << (r.epochs.size() == 1 ? " epoch" : " epochs")
            << " (" << r.steps << " steps in all) in " << FormatDuration(seconds);
  if (seconds > 0)
    std::cout << ", " << static_cast<int64_t>(samples / seconds + 0.5) << " samples/s";
  const train::EpochStats& last = r.epochs.back();
  if (last.val_top1 >= 0) {
    char top1[32];
    std::snprintf(top1, sizeof(top1), "%.2f%%", 100 * last.val_top1);
    std::cout << "; val top-1 " << top1;
  }
  if (!r.checkpoint.empty()) std::cout << "; checkpoint " << r.checkpoint;
  std::cout << "\n";
}

int RunTrain(TrainArgs& a) {
  if (a.batch == "auto") {
    a.o.batch_size = 0;
  } else {
    try {
      size_t used = 0;
      a.o.batch_size = std::stoll(a.batch, &used);
      if (used != a.batch.size() || a.o.batch_size < 1) throw std::invalid_argument(a.batch);
    } catch (const std::exception&) {
      return ReportError("train", Status::InvalidArgument("--batch-size " + a.batch +
                                                          ": expected a positive number or auto"));
    }
  }
  for (Status s : {train::ParseOptimizer(a.optimizer, &a.o.optimizer),
                   train::ParseLrSchedule(a.schedule, &a.o.schedule),
                   train::ParseLrScaling(a.lr_scaling, &a.o.lr_scaling),
                   train::ParsePrecisionChoice(a.precision, &a.o.precision)})
    if (!s.ok()) return ReportError("train", s);
  if (!a.memory_budget.empty()) {
    uint64_t bytes = 0;
    Status s = ParseByteSize(a.memory_budget, "--memory-budget", &bytes);
    if (!s.ok()) return ReportError("train", s);
    a.o.memory_budget = static_cast<int64_t>(bytes);
  }
  std::stringstream list(a.freeze);
  for (std::string item; std::getline(list, item, ',');)
    if (!item.empty()) a.o.freeze.push_back(item);
  std::cout << std::unitbuf;  // progress lines appear as they happen, also through a pipe
  train::TrainResult result;
  Status s = train::Train(a.o, &result);
  if (!s.ok()) return ReportError("train", s);
  if (result.interrupted) return 130;
  PrintSummary(result);
  return kExitOk;
}

KILN_COMMAND(Command{
    "train", "Train a model on a cache (LibTorch; CPU or CUDA)", 50,
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<TrainArgs>();
      train::TrainOptions& o = a->o;
      sub->add_option("--data", o.data, "training cache directory")->required();
      sub->add_option("--val", o.val, "validation cache directory (evaluated every epoch)");
      sub->add_flag("--allow-mismatch", o.allow_mismatch,
                    "accept a validation cache preprocessed differently from the training cache");
      sub->add_flag("!--no-verify", o.verify, "skip the start-up `verify --level quick`");
      sub->add_option("--model", o.model,
                      "mlp | cnn | resnet18 | resnet34 | resnet50, or a TorchScript FILE.pt (default cnn)");
      sub->add_option("--init", o.init, "load weights (by name and shape) from a kiln checkpoint "
                                        "directory or a TorchScript file");
      sub->add_flag("--replace-head", o.replace_head,
                    "give the final linear layer the cache's number of classes (fresh weights)");
      sub->add_option("--freeze", a->freeze, "freeze parameters by name prefix: PREFIX[,PREFIX...]");
      sub->add_option("--freeze-until", o.freeze_until, "freeze every parameter before NAME");
      sub->add_option("--epochs", o.epochs, "epochs (default 5)");
      sub->add_option("--max-steps", o.max_steps,
                      "stop after this many optimizer steps in all, saving a checkpoint with --save");
      sub->add_option("--batch-size", a->batch, "micro-batch size, or auto (default 128)");
      sub->add_option("--memory-budget", a->memory_budget,
                      "limit for --batch-size auto, e.g. 4GB (default 50% of RAM on the CPU)");
      sub->add_option("--max-batch", o.max_batch, "largest batch --batch-size auto tries (default 4096)");
      sub->add_option("--accum-steps", o.accum_steps, "micro-batches per optimizer step (default 1)");
      sub->add_option("--lr-scaling", a->lr_scaling,
                      "none | linear | sqrt: scale --lr by effective batch / --base-batch");
      sub->add_option("--base-batch", o.base_batch, "the batch size --lr is meant for (default 256)");
      sub->add_option("--optimizer", a->optimizer, "sgd | adamw (default sgd)");
      sub->add_option("--lr", o.lr, "learning rate (default 0.05)");
      sub->add_option("--lr-head", o.lr_head, "learning rate of the final layer (default --lr)");
      sub->add_option("--momentum", o.momentum, "SGD momentum (default 0.9)");
      sub->add_flag("--nesterov", o.nesterov, "Nesterov momentum");
      sub->add_option("--weight-decay", o.weight_decay, "weight decay (default 5e-4)");
      sub->add_option("--schedule", a->schedule, "constant | step | cosine | onecycle (default cosine)");
      sub->add_option("--warmup-epochs", o.warmup_epochs, "linear warm-up, in epochs (may be fractional)");
      sub->add_option("--step-epochs", o.step_epochs, "step schedule: epochs between decays (default 30)");
      sub->add_option("--gamma", o.gamma, "step schedule: decay factor (default 0.1)");
      sub->add_option("--label-smoothing", o.label_smoothing, "label smoothing (default 0)");
      sub->add_option("--precision", a->precision,
                      "fp32 | bf16 | fp16 | auto (default auto: bf16/fp16 on a GPU; bf16 on a CPU with native "
                      "bf16 (AVX512-BF16/AMX), fp32 on other CPUs)");
      sub->add_option("--device", o.device, "auto | cpu | cuda | cuda:N (default auto)");
      sub->add_option("--workers", o.workers, "loader threads (default 2)");
      sub->add_option("--dist-timeout", o.dist_timeout,
                      "distributed: seconds to wait for the other ranks at start-up and in each "
                      "collective (default 300)");
      sub->add_option("--threads", o.threads, "LibTorch intra-op threads (default on the CPU: one per usable CPU)");
      sub->add_option("--crop", o.crop, "random crop (val: center crop) to CROP x CROP at load time");
      sub->add_flag("--flip", o.flip, "random horizontal flip at load time");
      sub->add_option("--augment", o.augment,
                      "load-time augmentation: rrc (RandomResizedCrop to --crop + flip for "
                      "training, Resize + CenterCrop for --val, as torchvision's ImageNet recipe; "
                      "uint8 caches), none (a --crop window), auto (rrc on a cache of whole "
                      "images, else none)")
          ->check(CLI::IsMember({"auto", "none", "rrc"}));
      sub->add_option("--res-schedule", o.res_schedule,
                      "progressive resizing (FFCV's start_ramp/end_ramp/min_res/max_res) with "
                      "--augment rrc: MIN:MAX:START:END[:STEP], e.g. 160:192:0:2 - each epoch's "
                      "crop size from MIN (up to epoch START) to MAX (from epoch END), in steps "
                      "of STEP (32); --crop is then the evaluation size (default MAX)");
      sub->add_flag("--channels-last", o.channels_last, "channels-last (NHWC) input layout");
      sub->add_flag("--profile", o.profile,
                    "report where each epoch's step time went: data wait, forward, backward, "
                    "optimizer (waits for the GPU at each phase)");
      sub->add_option("--seed", o.seed, "seed of weights, order and augmentation (default 0)");
      sub->add_option("--log-every", o.log_every, "steps between progress lines (default 50)");
      sub->add_option("--metrics", o.metrics, "write one JSON object per log step and per epoch");
      sub->add_option("--save", o.save, "checkpoint directory, written after every epoch");
      sub->add_option("--resume", o.resume, "continue from a checkpoint directory");
      sub->add_option("--export", o.export_path, "write the trained model as TorchScript FILE.pt");
      sub->add_option(
          "--export-state-dict", o.export_state_dict,
          "write its weights as a state_dict FILE.pth for Python: "
          "torchvision.models.resnet18(num_classes=N).load_state_dict(torch.load(FILE))");
      AddExamples(sub, {"kiln train --data OUT/train --val OUT/val --model resnet18 --epochs 5",
                            "kiln train --data OUT/train --model cnn --batch-size auto --save ckpt"});
      return [a] { return RunTrain(*a); };
    },
    "", TorchEnvironment()});

}  // namespace
}  // namespace kiln::tools
