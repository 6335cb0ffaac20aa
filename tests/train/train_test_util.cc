#include "train_test_util.h"

#include <torch/script.h>
#undef CHECK
#include <catch2/catch.hpp>
#include <filesystem>

#include "kiln/train/model.h"
#include "kiln/train/tensor_loader.h"
#include "test_skip.h"

namespace kiln::testing {

using namespace kiln::train;

bool CudaDeviceOrSkip() {
  if (torch::cuda::is_available()) return true;
  Skip(SkipWhy::kNoDevice, train::NoCudaDevice("a [cuda] test").message());
  return false;
}

void SkipWithoutGloo(const std::string& log) {
#if KILN_NO_GLOO_BY_DESIGN
  Skip(SkipWhy::kHostCannot, "this LibTorch ships no Gloo headers, so kiln has no Gloo backend: " + log);
#else
  Skip(SkipWhy::kNotBuilt, "kiln was built without Gloo: " + log);
#endif
}

bool BuildSampleCaches(const TempDir& dir, const std::string& val_mean) {
  std::string out;
  const std::string norm = " --channels 1 --dtype float16 --std 0.3530 --progress none";
  const std::string kiln = KILN_BIN;
  // kiln built without images (KILN_WITH_IMAGE=OFF) has no build subcommand.
  if (RunCommand(kiln + " --help", &out) != 0 || out.find("\n  build ") == std::string::npos) {
    Skip(SkipWhy::kNotBuilt,
         "kiln has no build subcommand (KILN_WITH_IMAGE=OFF): the part of "
         "this test that needs caches of sample_data/ did not run");
    return false;
  }
  REQUIRE(RunCommand(kiln + " build " KILN_SAMPLE_DATA "/fashion/train " + dir / "train" +
                         " --mean 0.2860" + norm,
                     &out) == 0);
  REQUIRE(RunCommand(kiln + " build " KILN_SAMPLE_DATA "/fashion/val " + dir / "val" + " --mean " +
                         val_mean + norm,
                     &out) == 0);
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

}  // namespace kiln::testing
