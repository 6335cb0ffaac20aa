// kiln train's mixed precision: bf16 autocast on the CPU, what --precision
// auto chooses, and the loss scaler.
#include <torch/torch.h>
#include <torch/version.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>
#include <sstream>

#include "kiln/train/amp.h"
#include "kiln/train/model.h"
#include "kiln/train/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

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
  // LibTorch's fused ops where it has CPU kernels for them (2.3 on).
  CHECK(defaults.fused() ==
        (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)));

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

TEST_CASE(
    "kiln train --precision auto on the CPU: bf16 where the CPU computes bf16 natively, else fp32",
    "[train][amp]") {
  // The kernel's CPU flags decide, read here independently of kiln's parser.
  const std::string cpuinfo = ReadFile("/proc/cpuinfo");
  const bool native = cpuinfo.find(" avx512_bf16") != std::string::npos ||
                      cpuinfo.find(" amx_bf16") != std::string::npos;
  Precision p = Precision::kFp16;
  std::string why;
  REQUIRE(ResolvePrecision(PrecisionChoice::kAuto, torch::kCPU, &p, &why).ok());
  CHECK(p == (native ? Precision::kBf16 : Precision::kFp32));
  CHECK_THAT(why, Catch::Contains(native ? "computes bf16 natively" : "no native bf16"));
  // A precision given by name is kept, with no reason to tell.
  REQUIRE(ResolvePrecision(PrecisionChoice::kFp32, torch::kCPU, &p, &why).ok());
  CHECK(p == Precision::kFp32);
  CHECK(why.empty());

  // kiln train says what it chose and why.
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.precision = PrecisionChoice::kAuto;
  TrainResult r;
  Status s = Train(o, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK_THAT(log.str(), Catch::Contains(native ? "precision bf16 (auto: this CPU computes bf16"
                                               : "precision fp32 (auto: this CPU has no native"));
}

TEST_CASE("precision auto on a GPU: bf16 from compute capability 8.0, fp16 with loss scaling below",
          "[train][amp]") {
  std::string why;
  CHECK(GpuAutoPrecision(7, 0, &why) == Precision::kFp16);  // V100: bf16 only emulated
  CHECK_THAT(why, Catch::Contains("compute capability 7.0 emulates bf16 slowly") &&
                      Catch::Contains("fp16 with loss scaling"));
  CHECK(GpuAutoPrecision(7, 5) == Precision::kFp16);        // T4
  CHECK(GpuAutoPrecision(8, 0, &why) == Precision::kBf16);  // A100
  CHECK_THAT(why, Catch::Contains("compute capability 8.0 computes bf16 natively"));
  CHECK(GpuAutoPrecision(8, 6) == Precision::kBf16);
  CHECK(GpuAutoPrecision(9, 0, &why) == Precision::kBf16);  // H100, H200
  CHECK_THAT(why, Catch::Contains("9.0"));
}

// The scaler's sequence of the CPU test above, on a GPU with the fused ops.
TEST_CASE("the loss scaler on a GPU uses LibTorch's fused unscale and update",
          "[train][amp][cuda]") {
  if (!CudaDeviceOrSkip()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  LossScalerOptions so;
  so.growth_interval = 2;
  so.device = gpu;
  LossScaler scaler(so);
  CHECK(scaler.fused());
  torch::Tensor w = torch::ones({4}, torch::TensorOptions().device(gpu).requires_grad(true));
  auto step = [&](double inject) {
    w.mutable_grad() = torch::Tensor();
    scaler.Scale((w * torch::arange(1, 5, w.options().requires_grad(false))).sum()).backward();
    if (inject != 0) w.mutable_grad()[1] = inject;
    const bool finite = scaler.UnscaleAndCheck({w});
    scaler.Update(!finite);
    return finite;
  };
  CHECK(step(0));
  CHECK(torch::allclose(w.grad().cpu(), torch::arange(1, 5).to(torch::kFloat)));
  CHECK(step(0));
  CHECK(scaler.scale() == 131072.0);
  CHECK_FALSE(step(std::numeric_limits<float>::infinity()));
  CHECK(scaler.scale() == 65536.0);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 1);
  scaler.Restore(1024.0, 1, 3);
  CHECK(scaler.scale() == 1024.0);
  CHECK(step(0));
  CHECK(scaler.scale() == 2048.0);  // the restored tracker counted
}
