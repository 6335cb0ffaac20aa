// kiln train's built-in models (mlp, cnn, resnet18/34/50), each in two
// forms with the same parameter and buffer names and shapes (torchvision's:
// conv1, bn1, layer1.0.conv1, ..., layer2.0.downsample.0, ..., fc):
//
//  * an eager LibTorch module (torch::nn), which kiln train runs: autograd's
//    own backward kernels, no interpreter in the step, and the operators of
//    the Python model it mirrors (the resnets' in-place ReLU and residual
//    additions as torchvision writes them; the cnn as bench/train_parity.py's
//    KilnCNN);
//  * its TorchScript twin, assembled from TorchScript source, which
//    --export, --save and the checkpoints write, so that Python and LibTorch
//    load them with torch.jit.load and --init/--resume read them by name.
//
// Model::Build (model.cc) makes both and gives the twin the eager module's
// tensors, so the two always hold the same weights.
//
// Thread-safety: none needed; each call makes new modules.
#ifndef KILN_SRC_TRAIN_BUILTIN_MODELS_H_
#define KILN_SRC_TRAIN_BUILTIN_MODELS_H_

#include <torch/script.h>
#include <torch/torch.h>

#include "kiln/train/model.h"

namespace kiln::train::builtin {

// True for a name of BuiltinModelNames().
bool Known(const std::string& name);

// The eager module of a built-in model, initialized as torchvision does
// (convolutions Kaiming-normal, fan-out; BatchNorm 1 and 0; Linear
// PyTorch's default) from LibTorch's default generator, which the caller
// seeds. REQUIRES: Known(spec.name).
torch::nn::AnyModule MakeEager(const ModelSpec& spec);

// The TorchScript twin of the same model. Its tensors are left
// uninitialized: Model::Build replaces every one with the eager module's.
// REQUIRES: Known(spec.name).
torch::jit::Module MakeScript(const ModelSpec& spec);

}  // namespace kiln::train::builtin

#endif  // KILN_SRC_TRAIN_BUILTIN_MODELS_H_
