// kiln train's models: the built-in models' eager modules against their
// TorchScript twins (the implementation they replaced), the state_dict
// export, and how a TorchScript model's training step is differentiated.
#include <ATen/record_function.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#include "kiln/train/model.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

namespace {

double MaxAbs(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a - b).abs().max().item<double>();
}

// The names of the ATen operators that ran while `fn` did, on any thread
// (autograd's engine may run the backward pass on its own).
std::multiset<std::string> OperatorsRun(const std::function<void()>& fn) {
  static std::mutex mu;
  static std::multiset<std::string>* seen = nullptr;
  std::multiset<std::string> names;
  seen = &names;
  auto handle =
      at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction& f)
                                                           -> std::unique_ptr<at::ObserverContext> {
                              std::lock_guard<std::mutex> lock(mu);
                              if (seen) seen->insert(f.name());
                              return nullptr;
                            }).scopes({at::RecordScope::FUNCTION}));
  fn();
  at::removeCallback(handle);
  std::lock_guard<std::mutex> lock(mu);
  seen = nullptr;
  return names;
}

}  // namespace

TEST_CASE("each built-in model's eager module computes what its TorchScript twin does",
          "[train][model]") {
  for (const std::string name : {"mlp", "cnn", "resnet18", "resnet34", "resnet50"}) {
    INFO(name);
    const int64_t size = name == "mlp" ? 8 : 32;
    Model m;
    REQUIRE(Model::Build({name, 3, size, size, 10, 3}, &m).ok());
    CHECK(m.eager());
    torch::manual_seed(1);
    torch::Tensor x = torch::randn({4, 3, size, size});
    torch::NoGradGuard no_grad;
    // Training mode (batch statistics; both update the shared running ones).
    m.SetTraining(true);
    torch::Tensor eager = m.Forward(x);
    torch::Tensor script = m.module().forward({x}).toTensor();
    CHECK(eager.sizes() == torch::IntArrayRef({4, 10}));
    CHECK(MaxAbs(eager, script) < 1e-5);
    // Evaluation mode, after training steps have moved the running statistics.
    m.SetTraining(false);
    eager = m.Forward(x);
    script = m.module().forward({x}).toTensor();
    CHECK(MaxAbs(eager, script) < 1e-5);
    // The twin holds the eager module's tensors: one edit shows in both.
    m.Parameters(false).front().second.add_(0.5);
    CHECK(MaxAbs(m.Forward(x), m.module().forward({x}).toTensor()) < 1e-5);
    CHECK(MaxAbs(m.Forward(x), eager) > 1e-3);  // the comparison can fail
  }
}

TEST_CASE("a built-in model trains, freezes, takes a new head and exports as one model",
          "[train][model]") {
  Model m;
  REQUIRE(Model::Build({"cnn", 1, 28, 28, 10, 0}, &m).ok());
  REQUIRE(m.ReplaceHead(7, 5).ok());
  std::vector<std::string> frozen;
  REQUIRE(m.Freeze({"conv1", "bn1"}, "", &frozen).ok());
  CHECK(frozen.size() == 3);
  m.SetTraining(true);
  auto buffers = [&] {
    std::map<std::string, torch::Tensor> b;
    for (auto& [n, t] : m.Buffers()) b[n] = t.clone();
    return b;
  };
  auto before = buffers();
  torch::Tensor x = torch::randn({8, 1, 28, 28});
  torch::Tensor y = m.Forward(x);
  CHECK(y.sizes() == torch::IntArrayRef({8, 7}));  // the eager module sees the new head
  y.sum().backward();
  auto after = buffers();
  // The frozen BatchNorm stayed in eval mode in the module that ran; the others updated.
  CHECK(torch::equal(before.at("bn1.running_mean"), after.at("bn1.running_mean")));
  CHECK_FALSE(torch::equal(before.at("bn2.running_mean"), after.at("bn2.running_mean")));
  for (auto& [n, p] : m.Parameters(false)) {
    INFO(n);
    CHECK(p.grad().defined() == p.requires_grad());  // gradients reach the named tensors
  }

  TempDir dir;
  REQUIRE(m.Save(dir / "m.pt").ok());
  torch::jit::Module loaded = torch::jit::load(dir / "m.pt");
  loaded.eval();
  m.SetTraining(false);
  torch::NoGradGuard no_grad;
  CHECK(MaxAbs(m.Forward(x), loaded.forward({x}).toTensor()) < 1e-5);
}

TEST_CASE("the state_dict export holds every parameter and buffer by name", "[train][model]") {
  Model m;
  REQUIRE(Model::Build({"resnet18", 3, 32, 32, 10, 0}, &m).ok());
  TempDir dir;
  REQUIRE(m.SaveStateDict(dir / "m.pth").ok());
  std::ifstream f(dir / "m.pth", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  c10::IValue v = torch::pickle_load(bytes);
  REQUIRE(v.isGenericDict());
  auto dict = v.toGenericDict();
  auto params = m.Parameters(false);
  auto buffers = m.Buffers();
  CHECK(dict.size() == params.size() + buffers.size());  // 62 + 60 for resnet18
  CHECK(dict.size() == 122);
  for (const auto& list : {params, buffers})
    for (const auto& [name, t] : list) {
      INFO(name);
      REQUIRE(dict.contains(name));
      CHECK(torch::equal(dict.at(name).toTensor(), t));
      CHECK_FALSE(dict.at(name).toTensor().requires_grad());
    }
  Status s = m.SaveStateDict(std::string(dir / "missing") + "/m.pth");
  CHECK_FALSE(s.ok());
  CHECK(s.message().find("missing") != std::string::npos);
}

TEST_CASE("a TorchScript model's training step uses autograd's backward kernels",
          "[train][model]") {
  // The JIT's graph executor, left to optimize under grad mode, differentiates
  // the graph itself: ReLU's backward becomes gt + type_as + mul, slower than
  // autograd's threshold_backward (resnet18 1.4x slower a step under bf16).
  TempDir dir;
  Model built;
  REQUIRE(Model::Build({"cnn", 1, 28, 28, 10, 0}, &built).ok());
  REQUIRE(built.Save(dir / "cnn.pt").ok());
  Model m;
  REQUIRE(Model::Load(dir / "cnn.pt", &m).ok());
  CHECK_FALSE(m.eager());
  m.SetTraining(true);
  torch::Tensor x = torch::randn({16, 1, 28, 28});
  auto step = [&] { m.Forward(x).sum().backward(); };
  for (int i = 0; i < 4; ++i) step();  // the executor's profiling runs, then its plan
  auto ops = OperatorsRun(step);
  CHECK(ops.count("aten::threshold_backward") == 3);  // one per ReLU
  CHECK(ops.count("aten::gt") == 0);
  CHECK(ops.count("aten::convolution_backward") == 3);
}
