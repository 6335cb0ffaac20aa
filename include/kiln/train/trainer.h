// kiln train: a LibTorch training loop fed by kiln's loader.
//
// This header does not include LibTorch, so the command-line front end and
// tests of the torch-free parts compile quickly; everything that touches
// tensors is in src/train.
//
// Thread-safety: one Train() at a time per process (it installs a SIGINT
// handler and uses LibTorch's thread-local autocast state).
#ifndef KILN_TRAIN_TRAINER_H_
#define KILN_TRAIN_TRAINER_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::train {

// Choices among names, parsed once at the edge (tools/cmd_train.cc) with
// the Parse* functions below; the trainer works on the enums. Each Parse*
// returns InvalidArgument naming the option, the value and the choices
// ("--optimizer adam: expected sgd or adamw"); each *Name gives the name
// the option takes.
enum class OptimizerKind { kSgd, kAdamW };
enum class LrSchedule { kConstant, kStep, kCosine, kOneCycle };
enum class LrScaling { kNone, kLinear, kSqrt };
// kAuto: bf16 on a GPU of compute capability 8.0 or more, fp16 with loss
// scaling on an older one; on the CPU bf16 where it computes bf16
// natively, fp32 otherwise (ResolvePrecision in amp.h).
enum class PrecisionChoice { kAuto, kFp32, kBf16, kFp16 };

const char* OptimizerName(OptimizerKind v);
const char* LrScheduleName(LrSchedule v);
const char* LrScalingName(LrScaling v);
const char* PrecisionChoiceName(PrecisionChoice v);
Status ParseOptimizer(const std::string& name, OptimizerKind* out);
Status ParseLrSchedule(const std::string& name, LrSchedule* out);
Status ParseLrScaling(const std::string& name, LrScaling* out);
Status ParsePrecisionChoice(const std::string& name, PrecisionChoice* out);

struct TrainOptions {
  // Data.
  std::string data;                 // training cache
  std::string val;                  // validation cache; "" = none
  bool allow_mismatch = false;      // accept a val cache preprocessed differently
  bool verify = true;               // verify --level quick on every cache at start-up
  int workers = 2;                  // loader threads
  int dist_timeout = 300;           // seconds: rendezvous and each collective, distributed
  uint32_t crop = 0;                // random crop (train) / center crop (val) to crop x crop
  bool flip = false;                // random horizontal flip (train)
  // Load-time augmentation: "rrc" = RandomResizedCrop(crop) + flip for
  // training, Resize + CenterCrop(crop) for --val; "none" = a window of
  // --crop (random when training); "auto" = rrc on a cache of whole images
  // (kiln build --max-side / --shorter-side), else none.
  std::string augment = "auto";
  // FFCV's progressive resizing with --augment rrc, "MIN:MAX:START:END[:STEP]"
  // (kiln::ParseResolutionSchedule): each epoch's RandomResizedCrop size,
  // from MIN (up to epoch START) to MAX (from epoch END on) in steps of
  // STEP (32); --crop, when given, is the evaluation size (default MAX).
  // Empty: every epoch at --crop.
  std::string res_schedule;
  bool channels_last = false;

  // Model.
  std::string model = "cnn";        // built-in name, or a TorchScript file (*.pt)
  std::string init;                 // kiln checkpoint dir or TorchScript file to load weights from
  bool replace_head = false;        // give the final classifier the cache's class count
  std::vector<std::string> freeze;  // parameter-name prefixes to freeze
  std::string freeze_until;         // freeze every parameter before this one

  // Loop.
  int epochs = 5;
  int64_t max_steps = 0;            // stop after this many optimizer steps in all (0 = no limit)
  int64_t batch_size = 128;         // micro-batch; 0 = automatic (--batch-size auto)
  int64_t memory_budget = 0;        // bytes, for the automatic batch size; 0 = 90% GPU / 50% RAM
  int64_t max_batch = 4096;         // largest automatic batch size tried
  int accum_steps = 1;              // micro-batches per optimizer step
  LrScaling lr_scaling = LrScaling::kNone;  // of the effective batch vs base_batch
  int64_t base_batch = 256;         // the batch size --lr was chosen for
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double lr = 0.05;
  double lr_head = -1;              // learning rate of the head; < 0 = lr
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  LrSchedule schedule = LrSchedule::kCosine;
  double warmup_epochs = 0;         // linear warm-up from 0 (onecycle: its rising phase)
  int step_epochs = 30;             // step schedule: multiply by gamma every step_epochs
  double gamma = 0.1;
  double label_smoothing = 0;
  PrecisionChoice precision = PrecisionChoice::kAuto;
  std::string device = "auto";      // auto | cpu | cuda | cuda:N; under a launcher (LOCAL_RANK
                                    // set) cuda and auto mean cuda:LOCAL_RANK
  uint64_t seed = 0;
  int threads = 0;                  // LibTorch intra-op threads; 0 = on the CPU, kiln's choice
                                    // (DefaultCpuThreads), on a GPU LibTorch's default
  bool profile = false;             // time each step's forward, backward and optimizer phases
                                    // (EpochStats); on a GPU this waits for the device at
                                    // each phase's end, which slows training a little

  // Output.
  int64_t log_every = 50;           // steps between loss/accuracy reads (the only host syncs)
  std::string metrics;              // JSON lines file; "" = none
  std::string save;                 // checkpoint directory, written every epoch; "" = none
                                    // (replaced through siblings DIR.partial and DIR.old)
  std::string resume;               // checkpoint directory to continue from, with the same
                                    // model, data order, augmentation and optimizer options
                                    // (its state.json lists them; others are refused)
  std::string export_path;          // TorchScript file of the trained model; "" = none
  std::string export_state_dict;    // its parameters and buffers for Python's torch.load
                                    // (Model::SaveStateDict); "" = none
  std::ostream* log = nullptr;      // human-readable lines; nullptr = std::cout
};

struct EpochStats {
  int epoch = 0;
  double train_loss = 0, train_acc = 0;
  double val_loss = -1, val_top1 = -1, val_top5 = -1;  // -1 = not evaluated
  double seconds = 0, data_wait_seconds = 0, samples_per_second = 0;
  // Samples trained on in the epoch, by all ranks (a resumed epoch's part
  // before the checkpoint included).
  int64_t samples = 0;
  // With TrainOptions::profile, the epoch's training seconds by phase (of
  // this run: a resumed epoch counts from the resume); -1 otherwise. The
  // forward phase includes the loss, the optimizer phase the gradient
  // all-reduce, the loss-scale check, the step and zeroing the gradients.
  // seconds - data_wait - the three = the rest (the loop's own work).
  double forward_seconds = -1, backward_seconds = -1, optimizer_seconds = -1;
};

struct TrainResult {
  std::vector<EpochStats> epochs;  // the epochs this call ran (all or part)
  int64_t steps = 0;               // optimizer steps done in all (also before a resume)
  int64_t skipped_steps = 0;       // fp16 steps skipped for inf/NaN gradients
  int64_t batch_size = 0;          // the micro-batch used (chosen, when automatic)
  std::vector<std::string> optimized;  // names of the parameters in the optimizer
  bool interrupted = false;        // stopped by SIGINT after saving a checkpoint
  std::string checkpoint;          // the last checkpoint written, "" if none
  int intra_op_threads = 0;        // LibTorch's intra-op threads while training
  int host_ring_allocations = 0;   // times the loaders' shared host slots were allocated
};

// The intra-op threads kiln train gives LibTorch on the CPU without
// --threads: the CPUs this process may run on (its affinity mask), shared
// among the ranks on this host (LOCAL_WORLD_SIZE, as torchrun sets it), at
// least 1. LibTorch's own default counts physical cores as its cpuinfo
// sees them, and took 1 on the 2-core machines here (Python's torch too),
// leaving a core to the loader, whose work on a float16 cache is a copy.
// Fixed for a machine, so runs (and a resumed run) use the same reduction
// order.
int DefaultCpuThreads();

// Trains as `options` says. Errors name the cache, file or option at fault.
Status Train(const TrainOptions& options, TrainResult* result);

}  // namespace kiln::train

#endif  // KILN_TRAIN_TRAINER_H_
