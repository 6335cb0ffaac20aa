// Models for kiln train: a built-in model or a TorchScript file.
//
// The built-in ones (mlp, cnn, resnet18/34/50) are LibTorch modules run
// eagerly (torch::nn, src/train/builtin_models.cc), with torchvision's
// layer names and shapes (conv1, bn1, layer1.0.conv1, ..., fc), so
// torchvision weights map onto them by name. Each has a TorchScript twin
// that shares its tensors: module() is that twin, and --export, --save and
// the checkpoints write it, so Python loads them with torch.jit.load. A
// user's TorchScript file (--model FILE.pt) is module() itself and runs in
// the TorchScript interpreter. Head replacement, freezing, init,
// checkpoints and export are one code for both, over module()'s names.
//
// Thread-safety: a Model is used from one thread.
#ifndef KILN_TRAIN_MODEL_H_
#define KILN_TRAIN_MODEL_H_

#include <torch/nn/modules/container/any.h>
#include <torch/script.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::train {

// The input a model is sized for (from the cache's manifest).
struct ModelSpec {
  std::string name;  // mlp | cnn | resnet18 | resnet34 | resnet50
  int64_t channels = 3, height = 224, width = 224;
  int64_t classes = 10;
  uint64_t seed = 0;  // weight initialization
};

// The names of the built-in models, for help texts.
const std::vector<std::string>& BuiltinModelNames();

// What --init did, parameter and buffer names in each list.
struct InitReport {
  std::vector<std::string> loaded;   // same name and shape: copied
  std::vector<std::string> skipped;  // in the source, but the shape differs or not in the model
  std::vector<std::string> fresh;    // in the model, not (usably) in the source: kept as initialized
};

class Model {
 public:
  Model() = default;
  // A built-in model. InvalidArgument for an unknown name or an input too
  // small for it.
  static Status Build(const ModelSpec& spec, Model* out);
  // A TorchScript file; IoError naming the file when it cannot be loaded.
  static Status Load(const std::string& path, Model* out);

  // The TorchScript module: a user's file, or a built-in model's twin,
  // whose parameters and buffers are the eager module's tensors.
  torch::jit::Module& module() { return module_; }
  // True for a built-in model (run eagerly).
  bool eager() const { return !eager_.is_empty(); }
  // The model's forward pass: the eager module for a built-in model, else
  // the TorchScript interpreter. A TorchScript model's forward under grad
  // mode runs with the graph executor's optimizations off: they replace
  // autograd's backward kernels with the JIT's own formulas (ReLU's
  // backward as gt, type_as and mul, for one), which made resnet18's
  // training step 1.4x slower under bf16 autocast and 1.1x under fp32.
  torch::Tensor Forward(const torch::Tensor& x);

  // train(on) for the whole module, but BatchNorm layers whose parameters
  // are all frozen stay in eval mode.
  void SetTraining(bool on);
  void To(const torch::Device& device);
  torch::Device device() const;

  // The final classifier: the last submodule with a 2-D `weight` and a
  // matching 1-D `bias` (for example "fc"). Empty when none.
  const std::string& head() const { return head_; }
  // Gives the head `classes` outputs, freshly initialized (seeded).
  Status ReplaceHead(int64_t classes, uint64_t seed);

  // Freezes parameters whose names start with one of `prefixes`, and, if
  // `until` is not empty, every parameter before the first one whose name
  // starts with `until`. InvalidArgument when a prefix or `until` matches
  // nothing. Fills `frozen` with the names frozen.
  Status Freeze(const std::vector<std::string>& prefixes, const std::string& until,
                std::vector<std::string>* frozen);

  // Copies parameters and buffers of matching name and shape from a kiln
  // checkpoint directory (its model.pt) or a TorchScript file.
  Status InitFrom(const std::string& path, InitReport* report);

  // Named parameters; trainable_only drops frozen ones.
  std::vector<std::pair<std::string, torch::Tensor>> Parameters(bool trainable_only) const;
  std::vector<std::pair<std::string, torch::Tensor>> Buffers() const;
  int64_t CountParameters(bool trainable_only) const;
  // Runs one eval-mode forward pass of a zero sample of shape `sample`
  // (C, H, W) on the model's device and counts the multiply-adds of the
  // convolutions and matrix products it dispatches; `outputs` gets the
  // width of the output. InvalidArgument, with LibTorch's message, when the
  // model cannot take such an input.
  Status Probe(const std::vector<int64_t>& sample, double* macs, int64_t* outputs);

  // TorchScript file (model in eval mode as saved state; training flag kept).
  Status Save(const std::string& path);
  // The parameters and buffers by name, as a file that Python's torch.load
  // reads as a dict of CPU tensors: a state_dict, which for a built-in model
  // torchvision's model of the same name and classes loads as it is
  // (torchvision.models.resnet18(num_classes=N).load_state_dict(...)).
  Status SaveStateDict(const std::string& path) const;

 private:
  void FindHead();
  torch::jit::Module module_{"__torch__.kiln.Empty"};
  torch::nn::AnyModule eager_;  // a built-in model; empty for a TorchScript file
  std::string head_;
  bool training_ = true;
  std::vector<std::string> frozen_bn_;  // submodules kept in eval mode
};

// Both on one device, or InvalidArgument saying which is where.
Status CheckSameDevice(const Model& model, const torch::Tensor& inputs);

}  // namespace kiln::train

#endif  // KILN_TRAIN_MODEL_H_
