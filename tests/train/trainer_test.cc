// kiln train: models, mixed precision, the loss scaler, accumulation, the
// automatic batch size, freezing, checkpoints and resume, TorchScript
// models, and the start-up checks - on the CPU, on caches of sample_data/.
#include <torch/script.h>
#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <sstream>

#include "kiln/train/amp.h"
#include "kiln/train/model.h"
#include "kiln/train/trainer.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

namespace {

// Caches of sample_data/fashion (300 train, 100 val 28x28 grayscale), built
// with the kiln binary into `dir`. Empty when kiln was built without images.
bool BuildSampleCaches(const TempDir& dir, const std::string& val_mean = "0.2860") {
  std::string out;
  const std::string norm = " --channels 1 --dtype float16 --std 0.3530 --progress none";
  const std::string kiln = KILN_BIN;
  // kiln built without images (KILN_WITH_IMAGE=OFF) has no build subcommand.
  if (RunCommand(kiln + " --help", &out) != 0 || out.find("\n  build ") == std::string::npos) {
    WARN("kiln has no build subcommand: skipping the part of this test that needs sample caches");
    return false;
  }
  REQUIRE(RunCommand(kiln + " build " KILN_SAMPLE_DATA "/fashion/train " + dir / "train" +
                         " --mean 0.2860" + norm, &out) == 0);
  REQUIRE(RunCommand(kiln + " build " KILN_SAMPLE_DATA "/fashion/val " + dir / "val" +
                         " --mean " + val_mean + norm, &out) == 0);
  return true;
}

TrainOptions Quiet(const std::string& data, std::ostringstream* log) {
  TrainOptions o;
  o.data = data;
  o.batch_size = 32;
  o.epochs = 1;
  o.log_every = 0;
  o.workers = 2;
  o.precision = PrecisionChoice::kFp32;
  o.device = "cpu";
  o.log = log;
  return o;
}

std::map<std::string, torch::Tensor> LoadTensors(const std::string& file) {
  Model m;
  REQUIRE(Model::Load(file, &m).ok());
  std::map<std::string, torch::Tensor> out;
  for (auto& [n, t] : m.Parameters(false)) out[n] = t.detach().clone();
  for (auto& [n, t] : m.Buffers()) out[n] = t.detach().clone();
  return out;
}

// 64 synthetic records of 1x8x8 in 4 classes (no kiln build needed) and the
// mlp on them: 4 steps of batch 16 per epoch.
TrainOptions SyntheticMlp(const TempDir& dir, std::ostringstream* log) {
  if (!std::filesystem::exists(dir / "data"))
    WriteTestCache(dir / "data", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  TrainOptions o = Quiet(dir / "data", log);
  o.model = "mlp";
  o.batch_size = 16;
  return o;
}

double MaxDifference(const std::map<std::string, torch::Tensor>& a,
                     const std::map<std::string, torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& [n, t] : a) {
    REQUIRE(b.count(n) == 1);
    if (!t.is_floating_point()) {
      REQUIRE(torch::equal(t, b.at(n)));
      continue;
    }
    worst = std::max(worst, (t - b.at(n)).abs().max().item<double>());
  }
  return worst;
}

}  // namespace

TEST_CASE("resnet models have torchvision's parameter names, shapes and counts", "[train][model]") {
  Model m;
  REQUIRE(Model::Build({"resnet18", 3, 64, 64, 1000, 0}, &m).ok());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [n, t] : m.Parameters(false)) shapes[n] = t.sizes().vec();
  CHECK(m.CountParameters(false) == 11689512);  // torchvision.models.resnet18()
  CHECK((shapes.at("conv1.weight") == std::vector<int64_t>{64, 3, 7, 7}));
  CHECK((shapes.at("layer1.0.conv1.weight") == std::vector<int64_t>{64, 64, 3, 3}));
  CHECK((shapes.at("layer2.0.downsample.0.weight") == std::vector<int64_t>{128, 64, 1, 1}));
  CHECK((shapes.at("layer2.0.downsample.1.bias") == std::vector<int64_t>{128}));
  CHECK((shapes.at("fc.weight") == std::vector<int64_t>{1000, 512}));
  bool tracked = false;
  for (auto& [n, t] : m.Buffers()) tracked = tracked || n == "layer4.1.bn2.num_batches_tracked";
  CHECK(tracked);
  CHECK(m.head() == "fc");

  Model r50;
  REQUIRE(Model::Build({"resnet50", 3, 64, 64, 1000, 0}, &r50).ok());
  CHECK(r50.CountParameters(false) == 25557032);  // torchvision.models.resnet50()
  double macs = 0;
  int64_t outputs = 0;
  Model r18;
  REQUIRE(Model::Build({"resnet18", 3, 224, 224, 1000, 0}, &r18).ok());
  REQUIRE(r18.Probe({3, 224, 224}, &macs, &outputs).ok());
  CHECK(outputs == 1000);
  CHECK(macs == Approx(1.814e9).epsilon(0.01));  // resnet18's well-known 1.8 GMACs at 224

  Model bad;
  CHECK(Model::Build({"vgg", 3, 64, 64, 10, 0}, &bad).IsInvalidArgument());
}

TEST_CASE("cnn on sample_data: the loss falls and accuracy rises above chance", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.val = dir / "val";
  o.epochs = 4;
  o.metrics = dir / "metrics.jsonl";
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  REQUIRE(r.epochs.size() == 4);
  CHECK(r.epochs.back().train_loss < 0.8 * r.epochs.front().train_loss);
  CHECK(r.epochs.back().val_top1 > 0.3);  // 10 classes: chance is 0.1
  CHECK(r.epochs.back().val_top5 > r.epochs.back().val_top1);
  CHECK(r.epochs.back().data_wait_seconds >= 0);
  CHECK(log.str().find("input is") != std::string::npos);
  // One JSON line per epoch (log_every 0: no step lines).
  const std::string metrics = ReadFile(dir / "metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 4);
  CHECK(metrics.find("\"val_top1\"") != std::string::npos);
}

TEST_CASE("bf16 autocast on the CPU gives bf16 activations and trains", "[train][amp]") {
  Model m;
  REQUIRE(Model::Build({"cnn", 1, 28, 28, 10, 0}, &m).ok());
  torch::Tensor x = torch::randn({4, 1, 28, 28});
  {
    AutocastGuard amp(torch::kCPU, Precision::kBf16);
    CHECK(m.Forward(x).scalar_type() == torch::kBFloat16);
  }
  CHECK(m.Forward(x).scalar_type() == torch::kFloat);  // the scope ended

  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.precision = PrecisionChoice::kBf16;
  o.epochs = 3;
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK(log.str().find("precision bf16") != std::string::npos);
  CHECK(r.epochs.back().train_loss < r.epochs.front().train_loss);
}

TEST_CASE("the loss scaler grows, backs off and skips as GradScaler does", "[train][amp]") {
  LossScaler defaults;
  CHECK(defaults.scale() == 65536.0);

  LossScalerOptions so;
  so.growth_interval = 3;
  LossScaler scaler(so);
  torch::Tensor w = torch::ones({4}, torch::requires_grad());
  auto backward = [&](double inject) {
    w.mutable_grad() = torch::Tensor();
    torch::Tensor loss = (w * torch::tensor({1.0f, 2.0f, 3.0f, 4.0f})).sum();
    scaler.Scale(loss).backward();
    if (inject != 0) w.mutable_grad()[2] = inject;  // an overflowed gradient
  };
  for (int i = 0; i < 3; ++i) {
    backward(0);
    REQUIRE(scaler.UnscaleAndCheck({w}));
    CHECK(torch::allclose(w.grad(), torch::tensor({1.0f, 2.0f, 3.0f, 4.0f})));  // unscaled
    scaler.Update(false);
  }
  CHECK(scaler.scale() == 131072.0);  // x2 after 3 clean steps
  CHECK(scaler.growth_tracker() == 0);

  backward(0);
  REQUIRE(scaler.UnscaleAndCheck({w}));
  scaler.Update(false);
  CHECK(scaler.growth_tracker() == 1);
  backward(std::numeric_limits<float>::infinity());
  CHECK_FALSE(scaler.UnscaleAndCheck({w}));  // skip this step
  scaler.Update(true);
  CHECK(scaler.scale() == 65536.0);  // x0.5
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 1);
  backward(std::numeric_limits<float>::quiet_NaN());
  CHECK_FALSE(scaler.UnscaleAndCheck({w}));
  scaler.Update(true);
  CHECK(scaler.scale() == 32768.0);

  LossScaler off(LossScalerOptions{false});
  CHECK(off.scale() == 1.0);
  backward(std::numeric_limits<float>::infinity());
  CHECK(off.UnscaleAndCheck({w}));  // disabled: never skips
}

TEST_CASE("K micro-batches of B give the update of one batch of K*B", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  auto run = [&](int64_t batch, int accum, const std::string& save) {
    std::ostringstream log;
    TrainOptions o = Quiet(dir / "train", &log);
    o.model = "mlp";  // no BatchNorm: micro-batch statistics would differ
    o.batch_size = batch;
    o.accum_steps = accum;
    o.max_steps = 2;
    o.lr = 0.1;
    o.schedule = LrSchedule::kConstant;
    o.save = save;
    TrainResult r;
    Status s = Train(o, &r);
    INFO(log.str());
    REQUIRE(s.ok());
    REQUIRE(r.steps == 2);
    return LoadTensors(save + "/model.pt");
  };
  auto one = run(64, 1, dir / "one");
  auto accumulated = run(16, 4, dir / "four");
  auto unaccumulated = run(16, 1, dir / "plain");
  CHECK(MaxDifference(one, accumulated) < 1e-5);
  CHECK(MaxDifference(one, unaccumulated) > 1e-3);  // the comparison can fail
}

TEST_CASE("automatic batch size stops at out-of-memory, the budget or a plateau", "[train]") {
  int64_t chosen = 0;
  std::vector<BatchTrial> table;
  // Simulated device: 1 MB per sample, out of memory beyond 256, rate grows.
  auto device = [](int64_t b) {
    BatchTrial t;
    t.out_of_memory = b > 256;
    t.peak_bytes = b * 1000000;
    t.samples_per_second = 1000.0 * std::sqrt(static_cast<double>(b));
    return t;
  };
  REQUIRE(SearchBatchSize(32, 4096, 0, device, &chosen, &table).ok());
  CHECK(chosen == 256);
  REQUIRE(table.size() == 5);  // 32 64 128 256 512(oom)
  CHECK(table.back().out_of_memory);
  CHECK(table.back().note.find("out of memory") != std::string::npos);

  REQUIRE(SearchBatchSize(32, 4096, 100000000, device, &chosen, &table).ok());
  CHECK(chosen == 64);  // 128 needs 128 MB > 100 MB
  CHECK(table.back().batch == 128);

  auto plateau = [](int64_t b) {
    BatchTrial t;
    t.samples_per_second = b <= 64 ? 100.0 * b : 6500;
    return t;
  };
  REQUIRE(SearchBatchSize(16, 4096, 0, plateau, &chosen, &table).ok());
  CHECK(chosen == 64);
  CHECK(table.back().batch == 128);

  CHECK(SearchBatchSize(32, 4096, 1000, device, &chosen, &table).IsInvalidArgument());

  // A trial that fails for another reason (a damaged record) ends the search
  // with that error instead of passing for a rate.
  auto damaged = [&](int64_t b) {
    BatchTrial t = device(b);
    if (b == 128) t.error = Status::Corruption("shard-00000.mdb: record 7: checksum mismatch");
    return t;
  };
  const Status failed = SearchBatchSize(32, 4096, 0, damaged, &chosen, &table);
  CHECK(failed.IsCorruption());
  CHECK_THAT(failed.message(), Catch::Contains("batch 128") && Catch::Contains("record 7"));
  CHECK(table.size() == 3);

  // The real search on the CPU, end to end.
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.batch_size = 0;
  o.max_batch = 64;
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK((r.batch_size == 32 || r.batch_size == 64));
  CHECK(log.str().find("chose") != std::string::npos);
}

TEST_CASE("frozen parameters stay unchanged and are not optimized", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.freeze = {"conv1", "bn1"};
  o.epochs = 2;
  o.save = dir / "ck";
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  Model initial;
  REQUIRE(Model::Build({"cnn", 1, 28, 28, 10, 0}, &initial).ok());
  std::map<std::string, torch::Tensor> before;
  for (auto& [n, t] : initial.Parameters(false)) before[n] = t;
  for (auto& [n, t] : initial.Buffers()) before[n] = t;
  auto after = LoadTensors(dir / "ck/model.pt");
  for (const char* name : {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                           "bn1.running_var"}) {
    INFO(name);
    CHECK(torch::equal(before.at(name), after.at(name)));  // BatchNorm stayed in eval mode
  }
  CHECK_FALSE(torch::equal(before.at("conv2.weight"), after.at("conv2.weight")));
  CHECK_FALSE(torch::equal(before.at("bn2.running_mean"), after.at("bn2.running_mean")));
  for (const auto& n : r.optimized) CHECK((n.rfind("conv1.", 0) != 0 && n.rfind("bn1.", 0) != 0));
  CHECK(r.optimized.size() == initial.Parameters(false).size() - 3);

  o.freeze = {"conv9"};
  CHECK(Train(o, &r).IsInvalidArgument());
  o.freeze = {};
  o.freeze_until = "fc";
  o.save = "";
  REQUIRE(Train(o, &r).ok());
  CHECK((r.optimized == std::vector<std::string>{"fc.weight", "fc.bias"}));
}

TEST_CASE("a checkpoint resumed mid-epoch ends where an uninterrupted run ends", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  auto options = [&](std::ostringstream* log) {
    TrainOptions o = Quiet(dir / "train", log);
    o.epochs = 2;  // 300 samples / 32 = 9 steps per epoch
    o.seed = 7;
    return o;
  };
  std::ostringstream log;
  TrainOptions whole = options(&log);
  whole.save = dir / "whole";
  TrainResult r;
  REQUIRE(Train(whole, &r).ok());
  REQUIRE(r.steps == 18);

  TrainOptions first = options(&log);
  first.save = dir / "parts";
  first.max_steps = 5;  // stops inside epoch 1
  REQUIRE(Train(first, &r).ok());
  REQUIRE(r.steps == 5);
  TrainOptions rest = options(&log);
  rest.save = dir / "parts";
  rest.resume = dir / "parts";
  Status s = Train(rest, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK(r.steps == 18);
  CHECK(MaxDifference(LoadTensors(dir / "whole/model.pt"), LoadTensors(dir / "parts/model.pt")) ==
        0.0);

  TrainOptions other = options(&log);
  other.resume = dir / "parts";
  other.batch_size = 64;
  CHECK(Train(other, &r).IsInvalidArgument());  // says which batch the checkpoint used
}

TEST_CASE("model and data on different devices is an error naming both", "[train]") {
  Model m;
  REQUIRE(Model::Build({"mlp", 1, 8, 8, 3, 0}, &m).ok());
  CHECK(CheckSameDevice(m, torch::zeros({2, 1, 8, 8})).ok());
  torch::Tensor elsewhere = torch::empty({2, 1, 8, 8}, torch::TensorOptions().device(torch::kMeta));
  Status s = CheckSameDevice(m, elsewhere);
  CHECK(s.IsInvalidArgument());
  CHECK(s.message().find("model is on cpu") != std::string::npos);
  CHECK(s.message().find("meta") != std::string::npos);
}

TEST_CASE("running out of memory says so, with what to change, not a backtrace line", "[train]") {
  TempDir dir;
  WriteTestCache(dir / "data", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "data", &log);
  o.model = "mlp";
  o.device = "cpu";
  o.batch_size = int64_t{1} << 40;  // slots of 2^47 bytes: no allocator gives that
  TrainResult r;
  Status s = Train(o, &r);
  INFO(s.ToString());
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("ran out of memory") && Catch::Contains("--batch-size") &&
                              !Catch::Contains("frame #"));
}

TEST_CASE("a TorchScript model trains, takes a new head, initializes and exports", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  // A TorchScript file from elsewhere with 3 outputs (the cache has 10 classes).
  Model three;
  REQUIRE(Model::Build({"mlp", 1, 28, 28, 3, 5}, &three).ok());
  REQUIRE(three.Save(dir / "three.pt").ok());
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.model = dir / "three.pt";
  TrainResult r;
  Status s = Train(o, &r);
  CHECK(s.IsInvalidArgument());
  CHECK(s.message().find("--replace-head") != std::string::npos);

  o.replace_head = true;
  o.epochs = 2;
  o.export_path = dir / "trained.pt";
  s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  torch::jit::Module exported = torch::jit::load(dir / "trained.pt");
  torch::Tensor y = exported.forward({torch::zeros({2, 1, 28, 28})}).toTensor();
  CHECK(y.sizes() == torch::IntArrayRef({2, 10}));
  auto before = LoadTensors(dir / "three.pt");
  auto after = LoadTensors(dir / "trained.pt");
  CHECK_FALSE(torch::equal(before.at("fc1.weight"), after.at("fc1.weight")));  // it trained

  // --init from the export into a built-in mlp: everything loads.
  Model fresh;
  REQUIRE(Model::Build({"mlp", 1, 28, 28, 10, 9}, &fresh).ok());
  InitReport report;
  REQUIRE(fresh.InitFrom(dir / "trained.pt", &report).ok());
  CHECK(report.loaded.size() == 6);
  CHECK(report.fresh.empty());
  // ... and into a 3-class one: the head is skipped and stays fresh.
  REQUIRE(fresh.InitFrom(dir / "three.pt", &report).ok());
  Model small;
  REQUIRE(Model::Build({"mlp", 1, 28, 28, 7, 9}, &small).ok());
  REQUIRE(small.InitFrom(dir / "trained.pt", &report).ok());
  CHECK(report.loaded.size() == 4);
  CHECK((report.fresh == std::vector<std::string>{"fc.weight", "fc.bias"}));
}

TEST_CASE("start-up checks: damaged caches and mismatched validation caches are refused",
          "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir, "0.5")) return;  // val normalized with another mean
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.val = dir / "val";
  TrainResult r;
  Status s = Train(o, &r);
  CHECK(s.IsInvalidArgument());
  CHECK(s.message().find("mean: [0.286] vs [0.5]") != std::string::npos);
  CHECK(s.message().find("--allow-mismatch") != std::string::npos);
  o.allow_mismatch = true;
  CHECK(Train(o, &r).ok());

  // A truncated shard: verify --level quick at start-up catches it.
  std::string shard;
  for (const auto& e : std::filesystem::directory_iterator(dir / "train"))
    if (e.path().extension() == ".mdb") shard = e.path().string();
  REQUIRE(!shard.empty());
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 4096);
  s = Train(Quiet(dir / "train", &log), &r);
  CHECK(s.IsCorruption());
  CHECK(s.message().find("kiln verify") != std::string::npos);
}

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

TEST_CASE("Ctrl-C saves a checkpoint before exiting, and --resume finishes the run", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  // kiln train in a child process; SIGINT once it has logged its first steps.
  const std::string ck = dir / "ck";
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    const std::string data = dir / "train";
    ::execl(KILN_BIN, KILN_BIN, "train", "--data", data.c_str(), "--epochs", "10000", "--batch-size",
            "32", "--log-every", "1", "--save", ck.c_str(), "--precision", "fp32", "--device", "cpu",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string log;
  char buf[4096];
  bool signalled = false;
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) {
    log.append(buf, static_cast<size_t>(n));
    if (!signalled && log.find("epoch 1 step 3/") != std::string::npos) {
      ::kill(pid, SIGINT);
      signalled = true;
    }
  }
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO(log);
  REQUIRE(signalled);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(log.find("interrupted: checkpoint saved to " + ck) != std::string::npos);
  REQUIRE(std::filesystem::exists(ck + "/state.json"));
  REQUIRE(std::filesystem::exists(ck + "/model.pt"));

  // Resume it for 3 more steps: it continues from the saved step.
  const std::string state = ReadFile(ck + "/state.json");
  const size_t at = state.find("\"global_step\":");
  REQUIRE(at != std::string::npos);
  const int64_t saved = std::stoll(state.substr(at + 14));
  CHECK(saved >= 3);
  std::ostringstream resumed;
  TrainOptions o = Quiet(dir / "train", &resumed);
  o.epochs = 10000;
  o.max_steps = saved + 3;
  o.resume = ck;
  TrainResult r;
  Status s = Train(o, &r);
  INFO(resumed.str());
  REQUIRE(s.ok());
  CHECK(resumed.str().find("resume " + ck) != std::string::npos);
  CHECK(r.steps == saved + 3);
}

namespace {
// Trains the mlp on 64 synthetic records (no kiln build needed, so this runs
// on the GPU machine too, where kiln is built without images): it memorizes
// them, so the loss must fall.
void TrainSynthetic(const std::string& device, const std::string& precision) {
  TempDir dir;
  WriteTestCache(dir / "data", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "data", &log);
  o.model = "mlp";
  o.device = device;
  REQUIRE(ParsePrecisionChoice(precision, &o.precision).ok());
  o.epochs = 25;
  o.batch_size = 16;
  o.schedule = LrSchedule::kConstant;
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK(log.str().find("model on " + device) != std::string::npos);
  CHECK(log.str().find("float on " + device) != std::string::npos);  // the first batch
  CHECK(r.epochs.back().train_loss < 0.5 * r.epochs.front().train_loss);

  o.batch_size = 0;  // automatic, with the device's memory measured
  o.max_batch = 64;
  o.epochs = 1;
  std::ostringstream auto_log;
  o.log = &auto_log;
  s = Train(o, &r);
  INFO(auto_log.str());
  REQUIRE(s.ok());
  CHECK(auto_log.str().find("chose") != std::string::npos);
  CHECK(auto_log.str().find("not measured") == std::string::npos);
}
}  // namespace

TEST_CASE("the mlp memorizes a synthetic cache on the CPU", "[train]") {
  TrainSynthetic("cpu", "fp32");
}

TEST_CASE("kiln train on the GPU: model and batches on cuda, mixed precision, the loss falls",
          "[train][cuda]") {
  REQUIRE(torch::cuda::is_available());
  TrainSynthetic("cuda:0", "auto");
  Precision p;
  REQUIRE(ResolvePrecision(PrecisionChoice::kAuto, torch::Device(torch::kCUDA, 0), &p).ok());
  CHECK(p != Precision::kFp32);
  // fp16 with the loss scaler, on the GPU.
  TrainSynthetic("cuda:0", "fp16");
}

TEST_CASE("two ranks (Gloo, launched like torchrun) make the update of one process with twice the batch",
          "[train][dist]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  const std::string port = FreeLocalPort();  // for rank 0's store

  const std::string args = " train --data " + dir / "train" +
                           " --model mlp --max-steps 4 --epochs 1 --schedule constant --lr 0.1"
                           " --precision fp32 --device cpu --batch-size 16";
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = ::fork();
    REQUIRE(pids[r] >= 0);
    if (pids[r] == 0) {
      const std::string cmd = "RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                              "MASTER_PORT=" + port + " " + KILN_BIN + args + " --export " +
                              dir / ("rank" + std::to_string(r) + ".pt") + " > " +
                              dir / ("rank" + std::to_string(r) + ".log") + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  int statuses[2];
  for (int r = 0; r < 2; ++r) REQUIRE(::waitpid(pids[r], &statuses[r], 0) == pids[r]);
  if (ReadFile(dir / "rank0.log").find("without c10d") != std::string::npos) {
    WARN("kiln was built without Gloo: " << ReadFile(dir / "rank0.log"));
    return;
  }
  for (int r = 0; r < 2; ++r) {
    const int status = statuses[r];
    INFO(ReadFile(dir / ("rank" + std::to_string(r) + ".log")));
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const std::string log0 = ReadFile(dir / "rank0.log");
  CHECK(log0.find("rank 0 of 2") != std::string::npos);
  CHECK(log0.find("16 x 1 accumulation x 2 ranks = 32 per step") != std::string::npos);
  CHECK(ReadFile(dir / "rank1.log").find("model") == std::string::npos);  // rank 0 alone logs
  CHECK_FALSE(std::filesystem::exists(dir / "rank1.pt"));                 // ... and writes

  // One process, batch 32: the same samples per step (DistributedSampler's
  // interleaving), so the same update within float rounding.
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "train", &log);
  o.model = "mlp";
  o.max_steps = 4;
  o.schedule = LrSchedule::kConstant;
  o.lr = 0.1;
  o.batch_size = 32;
  o.export_path = dir / "single.pt";
  TrainResult r;
  REQUIRE(Train(o, &r).ok());
  CHECK(MaxDifference(LoadTensors(dir / "rank0.pt"), LoadTensors(dir / "single.pt")) < 1e-5);
}

TEST_CASE("a --save DIR/ saves beside DIR; a --save that cannot work fails before training",
          "[train]") {
  namespace fs = std::filesystem;
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.epochs = 2;  // two saves: the second replaces the first
  o.save = dir / "ck/";
  TrainResult r;
  Status s = Train(o, &r);
  INFO(s.ToString() << "\n" << log.str());
  REQUIRE(s.ok());
  CHECK(r.checkpoint == o.save);
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "ck/.partial"));
  CHECK_FALSE(fs::exists(dir / "ck.partial"));
  CHECK_FALSE(fs::exists(dir / "ck.old"));
  // "." and ".." parts, and --resume with a trailing slash.
  o.epochs = 3;
  o.resume = dir / "ck/";
  o.save = dir / "sub/../ck/./";
  REQUIRE(Train(o, &r).ok());
  CHECK(r.steps == 12);
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "sub"));
  o.resume = "";

  // A --save below a regular file: refused at start-up, naming the path,
  // before a step is trained.
  WriteFile(dir / "file", "not a directory");
  o.save = dir / "file/ck";
  std::ostringstream bad_log;
  o.log = &bad_log;
  s = Train(o, &r);
  CHECK(s.IsIOError());
  CHECK_THAT(s.message(), Catch::Contains("--save " + dir / "file/ck"));
  CHECK(bad_log.str().find("done in") == std::string::npos);
  CHECK(r.steps == 0);
  // A directory of other files would be replaced (and deleted) by the save.
  fs::create_directories(dir / "notes");
  WriteFile(dir / "notes/keep.txt", "mine");
  o.save = dir / "notes";
  s = Train(o, &r);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains(dir / "notes") && Catch::Contains("state.json"));
  CHECK(ReadFile(dir / "notes/keep.txt") == "mine");
  CHECK(bad_log.str().find("done in") == std::string::npos);
}

TEST_CASE("resume finds the checkpoint that a save stopped during its swap left behind",
          "[train]") {
  namespace fs = std::filesystem;
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.seed = 3;
  // Real checkpoints after epoch 1 and after epoch 2 (4 steps each).
  TrainResult r;
  o.epochs = 1;
  o.save = dir / "one";
  REQUIRE(Train(o, &r).ok());
  o.epochs = 2;
  o.save = dir / "two";
  REQUIRE(Train(o, &r).ok());
  REQUIRE(r.steps == 8);

  // Killed between DIR -> DIR.old and DIR.partial -> DIR: both complete, no
  // DIR. The newer, DIR.partial, is the one to continue.
  fs::rename(dir / "one", dir / "ck.old");
  fs::rename(dir / "two", dir / "ck.partial");
  o.epochs = 3;
  o.resume = dir / "ck";
  o.save = dir / "ck";
  std::ostringstream resumed;
  o.log = &resumed;
  Status s = Train(o, &r);
  INFO(s.ToString() << "\n" << resumed.str());
  REQUIRE(s.ok());
  CHECK_THAT(resumed.str(), Catch::Contains("using " + dir / "ck.partial"));
  CHECK(r.steps == 12);  // from the end of epoch 2
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "ck.partial"));
  CHECK_FALSE(fs::exists(dir / "ck.old"));

  // Killed while DIR.partial was being written (no state.json yet) after
  // the previous DIR became DIR.old: DIR.old is the one.
  fs::rename(dir / "ck", dir / "ck.old");
  fs::create_directories(dir / "ck.partial");
  fs::copy_file(dir / "ck.old/model.pt", dir / "ck.partial/model.pt");
  o.epochs = 4;
  std::ostringstream from_old;
  o.log = &from_old;
  s = Train(o, &r);
  INFO(s.ToString() << "\n" << from_old.str());
  REQUIRE(s.ok());
  CHECK_THAT(from_old.str(), Catch::Contains("using " + dir / "ck.old"));
  CHECK(r.steps == 16);  // from the end of epoch 3
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "ck.old"));

  // A fresh run saving into such a DIR ends with its own checkpoint there
  // (the save first renames the complete copy back to DIR, so that DIR is
  // complete whenever DIR.partial or DIR.old is deleted).
  fs::rename(dir / "ck", dir / "ck.old");
  fs::create_directories(dir / "ck.partial");
  o.resume = "";
  o.epochs = 1;
  REQUIRE(Train(o, &r).ok());
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK(ReadFile(dir / "ck/state.json").find("\"global_step\": 4") != std::string::npos);

  // Nothing complete anywhere: not a checkpoint, as before.
  o.resume = dir / "nothing";
  s = Train(o, &r);
  CHECK(s.IsNotFound());
  CHECK_THAT(s.message(), Catch::Contains(dir / "nothing") && Catch::Contains("--save"));
}

TEST_CASE("resume refuses options that would not continue the checkpoint's training",
          "[train]") {
  TempDir dir;
  std::ostringstream log;
  auto options = [&] {
    TrainOptions o = SyntheticMlp(dir, &log);
    o.epochs = 2;
    o.seed = 5;
    o.freeze = {"fc1"};
    return o;
  };
  TrainOptions first = options();
  first.max_steps = 2;
  first.save = dir / "ck";
  TrainResult r;
  REQUIRE(Train(first, &r).ok());
  const std::string ck = dir / "ck";

  struct Case {
    std::function<void(TrainOptions&)> change;
    std::string then, now;  // how the message shows the two runs' settings
  };
  const std::vector<Case> cases = {
      {[](TrainOptions& o) { o.freeze = {"fc2"}; }, "--freeze fc1", "--freeze fc2"},
      {[](TrainOptions& o) { o.freeze_until = "fc2"; }, "no --freeze-until", "--freeze-until fc2"},
      {[](TrainOptions& o) { o.lr_head = 0.01; }, "no --lr-head", "--lr-head 0.01"},
      {[](TrainOptions& o) { o.optimizer = OptimizerKind::kAdamW; }, "--optimizer sgd", "--optimizer adamw"},
      {[](TrainOptions& o) { o.seed = 6; }, "--seed 5", "--seed 6"},
      {[](TrainOptions& o) { o.flip = true; }, "no --flip", "--flip"},
      {[](TrainOptions& o) { o.crop = 6; }, "--crop 0", "--crop 6"},
      {[](TrainOptions& o) { o.accum_steps = 2; }, "--accum-steps 1", "--accum-steps 2"},
      {[](TrainOptions& o) { o.batch_size = 32; }, "--batch-size 16", "--batch-size 32"},
      {[](TrainOptions& o) { o.model = "cnn"; }, "--model mlp", "--model cnn"},
  };
  for (const auto& c : cases) {
    TrainOptions o = options();
    o.resume = ck;
    c.change(o);
    std::ostringstream refused;
    o.log = &refused;
    Status s = Train(o, &r);
    INFO(c.now << ": " << s.ToString());
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains("--resume " + ck + ": made with " + c.then +
                                            ", this run has " + c.now));
    CHECK(refused.str().find("resume ") == std::string::npos);  // refused before training
    CHECK(r.steps == 0);
  }

  // What may change: more epochs, logging, outputs, threads, --max-steps, --lr.
  TrainOptions more = options();
  more.resume = ck;
  more.epochs = 3;
  more.log_every = 1;
  more.metrics = dir / "metrics.jsonl";
  more.save = dir / "elsewhere";
  more.workers = 1;
  more.threads = 1;
  more.max_steps = 3;
  more.lr = 0.01;
  more.export_path = dir / "model.pt";
  Status s = Train(more, &r);
  INFO(s.ToString() << "\n" << log.str());
  REQUIRE(s.ok());
  CHECK(r.steps == 3);

  // A checkpoint from 2 ranks, resumed by one process.
  std::string state = ReadFile(ck + "/state.json");
  REQUIRE(state.find("\"WORLD_SIZE\": 1") != std::string::npos);
  WriteFile(ck + "/state.json",
            std::regex_replace(state, std::regex("\"WORLD_SIZE\": 1"), "\"WORLD_SIZE\": 2"));
  TrainOptions one = options();
  one.resume = ck;
  s = Train(one, &r);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("made with WORLD_SIZE=2, this run has WORLD_SIZE=1"));

  // An older checkpoint, without the settings: accepted as before.
  WriteFile(ck + "/state.json",
            std::regex_replace(state, std::regex("\"settings\": \\{[^}]*\\},?"), ""));
  REQUIRE(ReadFile(ck + "/state.json").find("settings") == std::string::npos);
  TrainOptions older = options();
  older.resume = ck;
  older.seed = 6;
  s = Train(older, &r);
  INFO(s.ToString());
  CHECK(s.ok());
}

TEST_CASE("an epoch resumed in the middle reports the loss and accuracy of the whole epoch",
          "[train]") {
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.epochs = 2;
  o.seed = 11;
  TrainResult whole;
  REQUIRE(Train(o, &whole).ok());
  REQUIRE(whole.epochs.size() == 2);

  o.save = dir / "ck";
  o.max_steps = 2;  // half of epoch 1
  TrainResult part;
  REQUIRE(Train(o, &part).ok());
  o.max_steps = 0;
  o.resume = dir / "ck";
  o.metrics = dir / "metrics.jsonl";
  TrainResult rest;
  Status s = Train(o, &rest);
  INFO(s.ToString() << "\n" << log.str());
  REQUIRE(s.ok());
  REQUIRE(rest.epochs.size() == 2);
  CHECK(std::abs(rest.epochs[0].train_loss - whole.epochs[0].train_loss) < 1e-6);
  CHECK(rest.epochs[0].train_acc == whole.epochs[0].train_acc);
  CHECK(rest.epochs[0].samples_per_second > 0);
  CHECK(std::abs(rest.epochs[1].train_loss - whole.epochs[1].train_loss) < 1e-6);
  // The metrics line of epoch 1 has the whole epoch's loss too.
  const std::string metrics = ReadFile(dir / "metrics.jsonl");
  const size_t at = metrics.find("\"train_loss\":");
  REQUIRE(at != std::string::npos);
  CHECK(std::abs(std::stod(metrics.substr(at + 13)) - whole.epochs[0].train_loss) < 1e-6);
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
  for (auto v : {LrSchedule::kConstant, LrSchedule::kStep, LrSchedule::kCosine, LrSchedule::kOneCycle}) {
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
  CHECK(s.ToString().find("--precision fp8: expected fp32, bf16, fp16 or auto") != std::string::npos);
  CHECK(p == PrecisionChoice::kBf16);  // untouched by a failed parse
}

TEST_CASE("on the CPU kiln train gives LibTorch one thread per usable CPU, and --threads overrides it",
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

TEST_CASE("a TorchScript model with dropout trains the same twice with the same --seed", "[train]") {
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  // An mlp whose forward drops half of its inputs while training.
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module m("__torch__.DropNet", cu, true);
  m.register_attribute("training", c10::BoolType::get(), true);
  torch::manual_seed(3);
  m.register_parameter("weight", (torch::randn({4, 64}) * 0.1).requires_grad_(), false);
  m.register_parameter("bias", torch::zeros({4}).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    x = torch.dropout(torch.flatten(x, 1), 0.5, self.training)
    return torch.linear(x, self.weight, self.bias)
)");
  m.save(dir / "drop.pt");
  o.model = dir / "drop.pt";
  o.epochs = 2;
  auto run = [&](uint64_t seed) {
    o.seed = seed;
    TrainResult r;
    Status s = Train(o, &r);
    INFO(log.str());
    REQUIRE(s.ok());
    return r.epochs.back().train_loss;
  };
  const double a = run(0), b = run(0), c = run(1);
  CHECK(a == b);  // bit for bit
  CHECK(a != c);  // the seed does decide the dropout masks (and the order)
}
