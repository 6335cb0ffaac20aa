// kiln train: models, the loop on sample_data/, accumulation, the automatic
// batch size, freezing, devices, out of memory, TorchScript models, the
// start-up checks, two ranks - on the CPU, on caches of sample_data/.
#include <torch/script.h>
#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <sstream>

#include "kiln/train/amp.h"
#include "kiln/train/model.h"
#include "batch_size.h"
#include "kiln/train/trainer.h"
#include "test_skip.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

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
  // One host ring for training and evaluation (batch 64), sized once.
  CHECK(r.host_ring_allocations == 1);
  // One JSON line per epoch (log_every 0: no step lines).
  const std::string metrics = ReadFile(dir / "metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 4);
  CHECK(metrics.find("\"val_top1\"") != std::string::npos);
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

  // The optimizer's state, which the trials do not hold, is added to their
  // peaks: a momentum buffer per parameter, AdamW's two moments.
  TrainOptions so;
  so.optimizer = OptimizerKind::kSgd;
  so.momentum = 0.9;
  CHECK(OptimizerStateBytes(so, 1000) == 1000);
  so.momentum = 0;
  CHECK(OptimizerStateBytes(so, 1000) == 0);
  so.optimizer = OptimizerKind::kAdamW;
  CHECK(OptimizerStateBytes(so, 1000) == 2000);

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
  // cnn's 0.1 M parameters: 0.4 MB of SGD momentum in every peak.
  CHECK_THAT(log.str(), Catch::Contains("peaks include 0.4 MB of sgd state"));
  CHECK(r.host_ring_allocations == 2);  // grown for trials 32 and 64, then reused
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
  for (const char* name :
       {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"}) {
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
  if (!CudaDeviceOrSkip()) return;
  TrainSynthetic("cuda:0", "auto");
  Precision p;
  REQUIRE(ResolvePrecision(PrecisionChoice::kAuto, torch::Device(torch::kCUDA, 0), &p).ok());
  CHECK(p != Precision::kFp32);
  // fp16 with the loss scaler, on the GPU.
  TrainSynthetic("cuda:0", "fp16");
}

namespace {
// Runs `kiln train ARGS` as ranks 0 and 1 of 2 (launched like torchrun, on
// one machine), rank r's output in DIR/rankR.log and its export, when ARGS
// ask for one, in DIR/rankR.pt. False (with a warning) when kiln has no Gloo.
bool TrainTwoRanks(const TempDir& dir, const std::string& args) {
  const std::string port = FreeLocalPort();  // for rank 0's store
  int pids[2];
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    pids[r] = StartProcess(
        {"/bin/sh", "-c",
         "RANK=" + rank + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " exec " +
             KILN_BIN + " train" + args + " --export " + dir / ("rank" + rank + ".pt")},
        dir / ("rank" + rank + ".log"));
  }
  int status[2];
  for (int r = 0; r < 2; ++r) status[r] = WaitExit(pids[r]);
  if (ReadFile(dir / "rank0.log").find("without c10d") != std::string::npos) {
    SkipWithoutGloo(ReadFile(dir / "rank0.log"));
    return false;
  }
  for (int r = 0; r < 2; ++r) {
    INFO(ReadFile(dir / ("rank" + std::to_string(r) + ".log")));
    REQUIRE(status[r] == 0);
  }
  return true;
}
}  // namespace

TEST_CASE(
    "two ranks (Gloo, launched like torchrun) make the update of one process with twice the batch",
    "[train][dist]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  if (!TrainTwoRanks(dir, " --data " + dir / "train" +
                              " --model mlp --max-steps 4 --epochs 1 --schedule constant --lr 0.1"
                              " --precision fp32 --device cpu --batch-size 16"))
    return;
  const std::string log0 = ReadFile(dir / "rank0.log");
  CHECK(log0.find("rank 0 of 2 (Gloo on cpu") != std::string::npos);
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

TEST_CASE(
    "two ranks leave a parameter no rank uses alone - no weight decay, no momentum - as one "
    "process does",
    "[train][dist]") {
  TempDir dir;
  WriteTestCache(dir / "data", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  // A TorchScript model with a parameter its forward never uses.
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module m("__torch__.Spare", cu, true);
  m.register_attribute("training", c10::BoolType::get(), true);
  torch::manual_seed(3);
  m.register_parameter("weight", (torch::randn({4, 64}) * 0.1).requires_grad_(), false);
  m.register_parameter("bias", torch::zeros({4}).requires_grad_(), false);
  m.register_parameter("spare", torch::full({3}, 2.0).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(torch.flatten(x, 1), self.weight, self.bias)
)");
  m.save(dir / "spare.pt");
  if (!TrainTwoRanks(dir, " --data " + dir / "data" + " --model " + dir / "spare.pt" +
                              " --max-steps 4 --epochs 1 --schedule constant --lr 0.1"
                              " --weight-decay 0.01 --precision fp32 --device cpu --batch-size 8"
                              " --log-every 0"))
    return;
  std::ostringstream log;
  TrainOptions o = Quiet(dir / "data", &log);
  o.model = dir / "spare.pt";
  o.max_steps = 4;
  o.schedule = LrSchedule::kConstant;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  o.batch_size = 16;
  o.export_path = dir / "single.pt";
  TrainResult r;
  REQUIRE(Train(o, &r).ok());
  const auto two = LoadTensors(dir / "rank0.pt"), one = LoadTensors(dir / "single.pt");
  CHECK(torch::equal(one.at("spare"), torch::full({3}, 2.0)));
  CHECK(torch::equal(two.at("spare"), one.at("spare")));
  CHECK_FALSE(torch::equal(two.at("weight"), m.attr("weight").toTensor()));  // it trained
  CHECK(MaxDifference(two, one) < 1e-5);
}

TEST_CASE("a TorchScript model with dropout trains the same twice with the same --seed",
          "[train]") {
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

TEST_CASE("kiln train runs with passive OpenMP waits and malloc keeping freed memory", "[train]") {
  // tools/command.h's TorchEnvironment, set by `kiln train` before kiln-train
  // starts (glibc reads GLIBC_TUNABLES at start-up); the cpu line says so. A
  // setting of the user's own wins.
  TempDir dir;
  WriteTestCache(dir / "data", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  const std::string cmd = std::string(KILN_BIN) + " train --data " + (dir / "data") +
                          " --model mlp --max-steps 1 --batch-size 16 --log-every 0 2>&1";
  std::string out;
  REQUIRE(RunCommand("env -u OMP_WAIT_POLICY -u GLIBC_TUNABLES " + cmd, &out) == 0);
  INFO(out);
  CHECK(out.find("OMP_WAIT_POLICY=PASSIVE") != std::string::npos);
  CHECK(out.find("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:"
                 "glibc.malloc.trim_threshold=1099511627776") != std::string::npos);
  REQUIRE(RunCommand("env GLIBC_TUNABLES=glibc.malloc.arena_max=2 " + cmd, &out) == 0);
  CHECK(out.find("GLIBC_TUNABLES=glibc.malloc.arena_max=2\n") != std::string::npos);
}

TEST_CASE(
    "an elastic resume: 2 ranks of batch 16 stopped mid-epoch, resumed by one process of batch 32, "
    "train as one process of batch 32 throughout",
    "[train][dist]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  const std::string common =
      " --model mlp --epochs 2 --schedule cosine --lr 0.1 --momentum 0.9"
      " --precision fp32 --device cpu --log-every 0";
  if (!TrainTwoRanks(dir, " --data " + dir / "train" + common +
                              " --batch-size 16 --max-steps 3 --save " + dir / "ck"))
    return;
  REQUIRE(ReadFile(dir / "ck/state.json").find("\"step_in_epoch\": 3") != std::string::npos);
  auto single = [&](const std::string& out, const std::string& resume, int64_t max_steps,
                    std::ostringstream* log) {
    TrainOptions o = Quiet(dir / "train", log);
    o.model = "mlp";
    o.epochs = 2;
    o.schedule = LrSchedule::kCosine;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.batch_size = 32;
    o.max_steps = max_steps;
    o.resume = resume;
    o.save = dir / (out + "-ck");
    o.export_path = dir / (out + ".pt");
    TrainResult r;
    const Status s = Train(o, &r);
    INFO(s.ToString() << "\n" << log->str());
    REQUIRE(s.ok());
    return r;
  };
  // Into the second epoch: the first one's rest, then a whole epoch.
  std::ostringstream resumed_log, whole_log;
  const TrainResult resumed = single("resumed", dir / "ck", 14, &resumed_log);
  CHECK_THAT(resumed_log.str(),
             Catch::Contains("resume elastic: made with WORLD_SIZE=2, batch 16 x 1 accumulation; "
                             "this run has 1, 32 x 1: epoch 1 continues after 96 of its"));
  const TrainResult whole = single("whole", "", 14, &whole_log);
  CHECK(resumed.steps == whole.steps);
  CHECK(MaxDifference(LoadTensors(dir / "resumed.pt"), LoadTensors(dir / "whole.pt")) < 1e-5);
  // The first epoch's loss and accuracy are the whole epoch's, in both.
  REQUIRE(resumed.epochs.size() >= 1);
  REQUIRE(whole.epochs.size() >= 1);
  CHECK(resumed.epochs[0].train_loss == Approx(whole.epochs[0].train_loss).epsilon(1e-4));
  CHECK(resumed.epochs[0].samples == 288);  // 9 steps of 32 of the 300
  CHECK(whole.epochs[0].samples == 288);

  // Resumed with half the global batch (one process of 16): the epoch's
  // other 204 samples in 12 steps of 16 (the last 12 dropped, as
  // DistributedSampler + drop_last do), each once - not from step 3 of 16.
  std::ostringstream half_log;
  TrainOptions half = Quiet(dir / "train", &half_log);
  half.model = "mlp";
  half.epochs = 1;
  half.batch_size = 16;
  half.resume = dir / "ck";
  TrainResult r;
  const Status s = Train(half, &r);
  INFO(s.ToString() << "\n" << half_log.str());
  REQUIRE(s.ok());
  CHECK_THAT(half_log.str(), Catch::Contains("epoch 1 continues after 96 of its 300 samples"));
  REQUIRE(r.epochs.size() == 1);
  CHECK(r.epochs[0].samples == 96 + 12 * 16);
  CHECK(r.steps == 96 / 16 + 12);  // counted in this run's steps of 16

  // Stopped again at once (--max-steps reached at the elastic epoch's step
  // 0), then resumed with the same settings: the checkpoint keeps the
  // epoch's skip and its earlier samples, and the epoch still adds up.
  std::ostringstream stop_log, again_log;
  TrainOptions stop = Quiet(dir / "train", &stop_log);
  stop.model = "mlp";
  stop.epochs = 1;
  stop.batch_size = 16;
  stop.resume = dir / "ck";
  stop.max_steps = 96 / 16;
  stop.save = dir / "ck2";
  REQUIRE(Train(stop, &r).ok());
  CHECK(ReadFile(dir / "ck2/state.json").find("\"epoch_skip\": 96") != std::string::npos);
  TrainOptions again = Quiet(dir / "train", &again_log);
  again.model = "mlp";
  again.epochs = 1;
  again.batch_size = 16;
  again.resume = dir / "ck2";
  const Status s2 = Train(again, &r);
  INFO(s2.ToString() << "\n" << again_log.str());
  REQUIRE(s2.ok());
  REQUIRE(r.epochs.size() == 1);
  CHECK(r.epochs[0].samples == 96 + 12 * 16);
  CHECK(r.steps == 96 / 16 + 12);
}
