// kiln train's options: learning-rate schedules and scaling, named choices,
// threads, and the --profile report.
#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK
#include <sched.h>

#include <catch2/catch.hpp>
#include <regex>
#include <sstream>

#include "optimizer.h"
#include "kiln/train/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

TEST_CASE("learning-rate schedules", "[train]") {
  TrainOptions o;
  o.schedule = LrSchedule::kCosine;
  o.warmup_epochs = 1;
  CHECK(ScheduledLr(o, 1.0, 0, 10, 100) == Approx(0.1));
  CHECK(ScheduledLr(o, 1.0, 9, 10, 100) == Approx(1.0));
  CHECK(ScheduledLr(o, 1.0, 10, 10, 100) == Approx(1.0));
  CHECK(ScheduledLr(o, 1.0, 55, 10, 100) == Approx(0.5));
  CHECK(ScheduledLr(o, 1.0, 100, 10, 100) == Approx(0.0).margin(1e-12));
  o.schedule = LrSchedule::kStep;
  o.warmup_epochs = 0;
  o.step_epochs = 2;
  o.gamma = 0.1;
  CHECK(ScheduledLr(o, 1.0, 19, 10, 100) == Approx(1.0));
  CHECK(ScheduledLr(o, 1.0, 20, 10, 100) == Approx(0.1));
  CHECK(ScheduledLr(o, 1.0, 45, 10, 100) == Approx(0.01));
  o.schedule = LrSchedule::kOneCycle;
  CHECK(ScheduledLr(o, 1.0, 0, 10, 100) == Approx(0.04));
  CHECK(ScheduledLr(o, 1.0, 30, 10, 100) == Approx(1.0));
  CHECK(ScheduledLr(o, 1.0, 100, 10, 100) == Approx(0.04 / 1e4));
  o.schedule = LrSchedule::kConstant;
  CHECK(ScheduledLr(o, 0.3, 77, 10, 100) == Approx(0.3));
}

TEST_CASE("lr scaling with --base-batch 0 is refused", "[train]") {
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.lr_scaling = LrScaling::kLinear;
  o.base_batch = 0;
  TrainResult r;
  Status s = Train(o, &r);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("--base-batch 0"));
  CHECK(r.steps == 0);
}

TEST_CASE("named choices parse once, and a bad one names the option, the value and the choices",
          "[train]") {
  OptimizerKind opt = OptimizerKind::kSgd;
  REQUIRE(ParseOptimizer("adamw", &opt).ok());
  CHECK(opt == OptimizerKind::kAdamW);
  LrSchedule sched = LrSchedule::kCosine;
  REQUIRE(ParseLrSchedule("onecycle", &sched).ok());
  CHECK(sched == LrSchedule::kOneCycle);
  LrScaling scaling = LrScaling::kNone;
  REQUIRE(ParseLrScaling("sqrt", &scaling).ok());
  CHECK(scaling == LrScaling::kSqrt);
  PrecisionChoice p = PrecisionChoice::kAuto;
  REQUIRE(ParsePrecisionChoice("bf16", &p).ok());
  CHECK(p == PrecisionChoice::kBf16);
  // Every name parses back to its value.
  for (auto v :
       {LrSchedule::kConstant, LrSchedule::kStep, LrSchedule::kCosine, LrSchedule::kOneCycle}) {
    REQUIRE(ParseLrSchedule(LrScheduleName(v), &sched).ok());
    CHECK(sched == v);
  }
  Status s = ParseOptimizer("adam", &opt);
  CHECK(s.IsInvalidArgument());
  CHECK(s.ToString().find("--optimizer adam: expected sgd or adamw") != std::string::npos);
  s = ParseLrSchedule("linear", &sched);
  CHECK(s.ToString().find("--schedule linear: expected constant, step, cosine or onecycle") !=
        std::string::npos);
  s = ParseLrScaling("log", &scaling);
  CHECK(s.ToString().find("--lr-scaling log: expected none, linear or sqrt") != std::string::npos);
  s = ParsePrecisionChoice("fp8", &p);
  CHECK(s.ToString().find("--precision fp8: expected fp32, bf16, fp16 or auto") !=
        std::string::npos);
  CHECK(p == PrecisionChoice::kBf16);  // untouched by a failed parse
}

TEST_CASE(
    "on the CPU kiln train gives LibTorch one thread per usable CPU, and --threads overrides it",
    "[train]") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  const int cpus = CPU_COUNT(&set);
  REQUIRE(unsetenv("LOCAL_WORLD_SIZE") == 0);
  CHECK(DefaultCpuThreads() == cpus);
  REQUIRE(setenv("LOCAL_WORLD_SIZE", "2", 1) == 0);  // two ranks on this host share the CPUs
  CHECK(DefaultCpuThreads() == std::max(1, cpus / 2));
  REQUIRE(unsetenv("LOCAL_WORLD_SIZE") == 0);

  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  torch::set_num_threads(cpus + 1);  // another count first, so that Train must set it
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK(at::get_num_threads() == cpus);
  CHECK(r.intra_op_threads == cpus);
  CHECK(log.str().find("threads " + std::to_string(cpus) + " intra-op (one per usable CPU)") !=
        std::string::npos);

  std::ostringstream log2;
  o.log = &log2;
  o.threads = cpus + 2;
  s = Train(o, &r);
  INFO(log2.str());
  REQUIRE(s.ok());
  CHECK(at::get_num_threads() == cpus + 2);
  CHECK(r.intra_op_threads == cpus + 2);
  CHECK(log2.str().find("threads " + std::to_string(cpus + 2) + " intra-op (--threads)") !=
        std::string::npos);
  torch::set_num_threads(cpus);  // the other tests run with kiln's choice
}

TEST_CASE(
    "kiln train --profile splits each epoch's training time into data wait, forward, backward and "
    "optimizer",
    "[train]") {
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.epochs = 2;
  TrainResult r;
  REQUIRE(Train(o, &r).ok());
  REQUIRE(r.epochs.size() == 2);
  CHECK(r.epochs[0].forward_seconds == -1);  // not profiled
  CHECK(log.str().find("profile:") == std::string::npos);

  std::ostringstream plog;
  o.log = &plog;
  o.profile = true;
  o.metrics = dir / "metrics.jsonl";
  Status s = Train(o, &r);
  INFO(plog.str());
  REQUIRE(s.ok());
  REQUIRE(r.epochs.size() == 2);
  for (const EpochStats& e : r.epochs) {
    CHECK(e.forward_seconds > 0);
    CHECK(e.backward_seconds > 0);
    CHECK(e.optimizer_seconds > 0);
    CHECK(e.data_wait_seconds + e.forward_seconds + e.backward_seconds + e.optimizer_seconds <=
          e.seconds);
  }
  // One line per epoch: "profile: X ms per step = data wait A + forward B + ...".
  const std::regex line(
      R"(profile: [0-9.]+ ms per step = data wait [0-9.]+ \+ forward [0-9.]+ \+ backward [0-9.]+ )"
      R"(\+ optimizer [0-9.]+ \+ other -?[0-9.]+)");
  const std::string text = plog.str();
  CHECK(std::distance(std::sregex_iterator(text.begin(), text.end(), line),
                      std::sregex_iterator()) == 2);
  const std::string metrics = ReadFile(dir / "metrics.jsonl");
  CHECK_THAT(metrics, Catch::Contains("\"profile_seconds\":{\"backward\":"));
  CHECK_THAT(metrics, Catch::Contains("\"steps\":4"));
}
