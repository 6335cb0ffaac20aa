// Helpers of the kiln::train tests (LibTorch): caches of sample_data/,
// quiet CPU options, a synthetic mlp run, and checkpoint tensors.
#ifndef KILN_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define KILN_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

// Include after <torch/torch.h> and `#undef CHECK` (glog's CHECK would
// replace Catch's), as the tests do.
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <string>

#include "kiln/train/trainer.h"
#include "test_util.h"

namespace kiln::testing {

// Caches of sample_data/fashion (300 train, 100 val 28x28 grayscale), built
// with the kiln binary into `dir`/train and `dir`/val (the latter normalized
// with `val_mean`). False when kiln was built without images, after
// Skip(kNotBuilt): the caller returns.
bool BuildSampleCaches(const TempDir& dir, const std::string& val_mean = "0.2860");

// For a [cuda] test case: true when CUDA has a device; otherwise false after
// Skip(kNoDevice, "no CUDA device: ..."), and the caller returns.
bool CudaDeviceOrSkip();

// For a test of several ranks over Gloo when kiln has no Gloo backend:
// Skip(kNotBuilt) - a failure in CI - unless this build lacks Gloo by design
// (a PyPI wheel's LibTorch ships no Gloo headers: KILN_NO_GLOO_BY_DESIGN),
// when the skip is visible but not a failure. `log` says what happened.
void SkipWithoutGloo(const std::string& log);

// Options for a short, silent run on the CPU in fp32: batch 32, one epoch,
// no log lines, the log to *log.
train::TrainOptions Quiet(const std::string& data, std::ostringstream* log);

// The parameters and buffers of a TorchScript file, by name (copies).
std::map<std::string, torch::Tensor> LoadTensors(const std::string& file);

// 64 synthetic records of 1x8x8 in 4 classes in `dir`/data (written once;
// no kiln build needed) and the mlp on them: 4 steps of batch 16 per epoch.
train::TrainOptions SyntheticMlp(const TempDir& dir, std::ostringstream* log);

// The largest absolute difference between tensors of the same names; the
// non-floating ones must be equal.
double MaxDifference(const std::map<std::string, torch::Tensor>& a,
                     const std::map<std::string, torch::Tensor>& b);

}  // namespace kiln::testing

#endif  // KILN_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
