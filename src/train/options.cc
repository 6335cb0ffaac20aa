// The trainer's named choices (trainer.h): names and parsing, no LibTorch.

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kiln/train/trainer.h"
#include "core/cpus.h"

namespace kiln::train {
namespace {

// The value of `choices` whose name is `name`, or InvalidArgument
// "OPTION NAME: expected A, B or C".
template <typename E, size_t N>
Status ParseChoice(const char* option, const std::string& name, const E (&choices)[N],
                   const char* (*name_of)(E), E* out) {
  for (E c : choices) {
    if (name == name_of(c)) {
      *out = c;
      return Status::OK();
    }
  }
  std::string expected;
  for (size_t i = 0; i < N; ++i)
    expected += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + name_of(choices[i]);
  return Status::InvalidArgument(std::string(option) + " " + name + ": expected " + expected);
}

}  // namespace

const char* OptimizerName(OptimizerKind v) {
  switch (v) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
}

const char* LrScheduleName(LrSchedule v) {
  switch (v) {
    case LrSchedule::kConstant: return "constant";
    case LrSchedule::kStep: return "step";
    case LrSchedule::kCosine: return "cosine";
    case LrSchedule::kOneCycle: return "onecycle";
  }
  return "?";
}

const char* LrScalingName(LrScaling v) {
  switch (v) {
    case LrScaling::kNone: return "none";
    case LrScaling::kLinear: return "linear";
    case LrScaling::kSqrt: return "sqrt";
  }
  return "?";
}

const char* PrecisionChoiceName(PrecisionChoice v) {
  switch (v) {
    case PrecisionChoice::kAuto: return "auto";
    case PrecisionChoice::kFp32: return "fp32";
    case PrecisionChoice::kBf16: return "bf16";
    case PrecisionChoice::kFp16: return "fp16";
  }
  return "?";
}

Status ParseOptimizer(const std::string& name, OptimizerKind* out) {
  static constexpr OptimizerKind kAll[] = {OptimizerKind::kSgd, OptimizerKind::kAdamW};
  return ParseChoice("--optimizer", name, kAll, OptimizerName, out);
}

Status ParseLrSchedule(const std::string& name, LrSchedule* out) {
  static constexpr LrSchedule kAll[] = {LrSchedule::kConstant, LrSchedule::kStep,
                                        LrSchedule::kCosine, LrSchedule::kOneCycle};
  return ParseChoice("--schedule", name, kAll, LrScheduleName, out);
}

Status ParseLrScaling(const std::string& name, LrScaling* out) {
  static constexpr LrScaling kAll[] = {LrScaling::kNone, LrScaling::kLinear, LrScaling::kSqrt};
  return ParseChoice("--lr-scaling", name, kAll, LrScalingName, out);
}

Status ParsePrecisionChoice(const std::string& name, PrecisionChoice* out) {
  static constexpr PrecisionChoice kAll[] = {PrecisionChoice::kFp32, PrecisionChoice::kBf16,
                                             PrecisionChoice::kFp16, PrecisionChoice::kAuto};
  return ParseChoice("--precision", name, kAll, PrecisionChoiceName, out);
}

int DefaultCpuThreads() {
  const int cpus = UsableCpus();
  int ranks = 1;
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) ranks = std::max(1, std::atoi(local));
  return std::max(1, cpus / ranks);
}

}  // namespace kiln::train
