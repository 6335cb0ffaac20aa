#include "builtin_models.h"

#include <string>
#include <utility>
#include <vector>

namespace kiln::train::builtin {
namespace {

// ---- the eager modules ------------------------------------------------------
//
// torchvision.models.resnet's structure and names, in LibTorch's module style.

torch::nn::Conv2d Conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  torch::nn::Conv2d c(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
  torch::nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);  // torchvision's
  return c;
}

torch::nn::BatchNorm2d Norm(int64_t c) { return torch::nn::BatchNorm2d(c); }

torch::nn::Linear Dense(int64_t in, int64_t out) { return torch::nn::Linear(in, out); }

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t classes)
      : fc1(register_module("fc1", Dense(in, 512))),
        fc2(register_module("fc2", Dense(512, 256))),
        fc(register_module("fc", Dense(256, classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(torch::flatten(x, 1)));
    x = torch::relu(fc2(x));
    return fc(x);
  }

  torch::nn::Linear fc1, fc2, fc;
};
TORCH_MODULE(Mlp);

// Three conv-BN-ReLU stages (32, 64, 128 channels, 2x2 max pooling between
// them), an adaptive 2x2 average pool and one linear layer: about 0.1 M
// parameters and 8 M multiply-adds per 28x28 sample.
struct CnnImpl : torch::nn::Module {
  CnnImpl(int64_t channels, int64_t classes)
      : conv1(register_module("conv1", Conv(channels, 32, 3, 1, 1))),
        bn1(register_module("bn1", Norm(32))),
        conv2(register_module("conv2", Conv(32, 64, 3, 1, 1))),
        bn2(register_module("bn2", Norm(64))),
        conv3(register_module("conv3", Conv(64, 128, 3, 1, 1))),
        bn3(register_module("bn3", Norm(128))),
        fc(register_module("fc", Dense(128 * 4, classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), {2, 2}, {2, 2});
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), {2, 2}, {2, 2});
    x = torch::relu(bn3(conv3(x)));
    x = torch::adaptive_avg_pool2d(x, {2, 2});
    return fc(torch::flatten(x, 1));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Conv2d conv3;
  torch::nn::BatchNorm2d bn3;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);

// ResNet's blocks, as torchvision's BasicBlock (expansion 1: two 3x3
// convolutions) and Bottleneck (expansion 4: 1x1, 3x3, 1x1, the stride on
// the 3x3 as in torchvision >= 0.6); conv3 and bn3 are empty in a basic block.
struct BlockImpl : torch::nn::Module {
  BlockImpl(bool bottleneck, int64_t inplanes, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", bottleneck ? Conv(inplanes, planes, 1, 1, 0)
                                                  : Conv(inplanes, planes, 3, stride, 1))),
        bn1(register_module("bn1", Norm(planes))),
        conv2(register_module("conv2", Conv(planes, planes, 3, bottleneck ? stride : 1, 1))),
        bn2(register_module("bn2", Norm(planes))) {
    const int64_t out = planes * Expansion(bottleneck);
    if (bottleneck) {
      conv3 = register_module("conv3", Conv(planes, out, 1, 1, 0));
      bn3 = register_module("bn3", Norm(out));
    }
    if (stride != 1 || inplanes != out)
      downsample = register_module(
          "downsample", torch::nn::Sequential(Conv(inplanes, out, 1, stride, 0), Norm(out)));
  }

  static int64_t Expansion(bool bottleneck) { return bottleneck ? 4 : 1; }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor out = bn1(conv1(x)).relu_();
    out = bn2(conv2(out));
    if (!conv3.is_empty()) out = bn3(conv3(out.relu_()));
    out += downsample.is_empty() ? x : downsample->forward(x);
    return out.relu_();
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Conv2d conv3{nullptr};
  torch::nn::BatchNorm2d bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Block);

struct ResNetImpl : torch::nn::Module {
  // `layers`: the blocks of each of the four stages.
  ResNetImpl(const ModelSpec& s, bool bottleneck, const std::vector<int>& layers)
      : conv1(register_module("conv1", Conv(s.channels, 64, 7, 2, 3))),
        bn1(register_module("bn1", Norm(64))) {
    int64_t inplanes = 64;
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t planes = int64_t{64} << stage;
      torch::nn::Sequential blocks;
      for (int b = 0; b < layers[stage]; ++b) {
        const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks->push_back(Block(bottleneck, inplanes, planes, stride));
        inplanes = planes * BlockImpl::Expansion(bottleneck);
      }
      layer[stage] = register_module("layer" + std::to_string(stage + 1), blocks);
    }
    fc = register_module("fc", Dense(inplanes, s.classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = bn1(conv1(x)).relu_();
    x = torch::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
    for (auto& stage : layer) x = stage->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1});
    return fc(torch::flatten(x, 1));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Sequential layer[4] = {nullptr, nullptr, nullptr, nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// ---- the TorchScript twins --------------------------------------------------

using torch::jit::Module;
using CU = std::shared_ptr<torch::jit::CompilationUnit>;

Module NewModule(const CU& cu, const std::string& type) {
  Module m("__torch__.kiln." + type, cu, /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), true);
  return m;
}

// Appended piece by piece: GCC 12's -Wrestrict misfires on "[" + std::string&&
// under C++20 (GCC bug 105329), which LibTorch 2.x makes kiln::train use.
std::string Pair(int64_t a) {
  const std::string n = std::to_string(a);
  std::string s = "[";
  s.append(n).append(", ").append(n).append("]");
  return s;
}

// Placeholders of the right shape: Model::Build puts the eager tensors in.
torch::Tensor Slot(std::vector<int64_t> shape) { return torch::empty(shape); }

Module ScriptConv(const CU& cu, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t pad) {
  Module m = NewModule(cu, "Conv2d");
  m.register_parameter("weight", Slot({cout, cin, k, k}), false);
  m.define("def forward(self, x):\n    return torch.conv2d(x, self.weight, None, " + Pair(stride) +
           ", " + Pair(pad) + ", [1, 1], 1)\n");
  return m;
}

Module ScriptNorm(const CU& cu, int64_t c) {
  Module m = NewModule(cu, "BatchNorm2d");
  m.register_parameter("weight", Slot({c}), false);
  m.register_parameter("bias", Slot({c}), false);
  m.register_buffer("running_mean", Slot({c}));
  m.register_buffer("running_var", Slot({c}));
  m.register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  m.define(R"(
def forward(self, x):
    if self.training:
        self.num_batches_tracked.add_(1)
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            self.training, 0.1, 1e-05, True)
)");
  return m;
}

Module ScriptLinear(const CU& cu, int64_t in, int64_t out) {
  Module m = NewModule(cu, "Linear");
  m.register_parameter("weight", Slot({out, in}), false);
  m.register_parameter("bias", Slot({out}), false);
  m.define("def forward(self, x):\n    return torch.linear(x, self.weight, self.bias)\n");
  return m;
}

Module Composite(const CU& cu, const std::string& type,
                 const std::vector<std::pair<std::string, Module>>& children,
                 const std::string& forward_source) {
  Module m = NewModule(cu, type);
  for (const auto& [name, child] : children) m.register_module(name, child);
  m.define(forward_source);
  return m;
}

// A numbered container (torchvision's nn.Sequential): children "0", "1", ...
Module ScriptSequential(const CU& cu, const std::vector<Module>& children) {
  std::vector<std::pair<std::string, Module>> named;
  std::string src = "def forward(self, x):\n";
  for (size_t i = 0; i < children.size(); ++i) {
    named.emplace_back(std::to_string(i), children[i]);
    src += "    x = getattr(self, \"" + std::to_string(i) + "\").forward(x)\n";
  }
  src += "    return x\n";
  return Composite(cu, "Sequential", named, src);
}

Module ScriptMlp(const CU& cu, const ModelSpec& s) {
  const int64_t in = s.channels * s.height * s.width;
  return Composite(cu, "MLP",
                   {{"fc1", ScriptLinear(cu, in, 512)},
                    {"fc2", ScriptLinear(cu, 512, 256)},
                    {"fc", ScriptLinear(cu, 256, s.classes)}},
                   R"(
def forward(self, x):
    x = torch.flatten(x, 1)
    x = torch.relu(self.fc1.forward(x))
    x = torch.relu(self.fc2.forward(x))
    return self.fc.forward(x)
)");
}

Module ScriptCnn(const CU& cu, const ModelSpec& s) {
  return Composite(cu, "CNN",
                   {{"conv1", ScriptConv(cu, s.channels, 32, 3, 1, 1)},
                    {"bn1", ScriptNorm(cu, 32)},
                    {"conv2", ScriptConv(cu, 32, 64, 3, 1, 1)},
                    {"bn2", ScriptNorm(cu, 64)},
                    {"conv3", ScriptConv(cu, 64, 128, 3, 1, 1)},
                    {"bn3", ScriptNorm(cu, 128)},
                    {"fc", ScriptLinear(cu, 128 * 4, s.classes)}},
                   R"(
def forward(self, x):
    x = torch.relu(self.bn1.forward(self.conv1.forward(x)))
    x = torch.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    x = torch.relu(self.bn2.forward(self.conv2.forward(x)))
    x = torch.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    x = torch.relu(self.bn3.forward(self.conv3.forward(x)))
    x = torch.adaptive_avg_pool2d(x, [2, 2])
    x = torch.flatten(x, 1)
    return self.fc.forward(x)
)");
}

Module ScriptBlock(const CU& cu, bool bottleneck, int64_t inplanes, int64_t planes,
                   int64_t stride) {
  const int64_t expansion = bottleneck ? 4 : 1;
  std::vector<std::pair<std::string, Module>> c;
  std::string src = "def forward(self, x):\n";
  if (bottleneck) {
    c = {{"conv1", ScriptConv(cu, inplanes, planes, 1, 1, 0)},
         {"bn1", ScriptNorm(cu, planes)},
         {"conv2", ScriptConv(cu, planes, planes, 3, stride, 1)},
         {"bn2", ScriptNorm(cu, planes)},
         {"conv3", ScriptConv(cu, planes, planes * 4, 1, 1, 0)},
         {"bn3", ScriptNorm(cu, planes * 4)}};
    src +=
        "    out = torch.relu(self.bn1.forward(self.conv1.forward(x)))\n"
        "    out = torch.relu(self.bn2.forward(self.conv2.forward(out)))\n"
        "    out = self.bn3.forward(self.conv3.forward(out))\n";
  } else {
    c = {{"conv1", ScriptConv(cu, inplanes, planes, 3, stride, 1)},
         {"bn1", ScriptNorm(cu, planes)},
         {"conv2", ScriptConv(cu, planes, planes, 3, 1, 1)},
         {"bn2", ScriptNorm(cu, planes)}};
    src +=
        "    out = torch.relu(self.bn1.forward(self.conv1.forward(x)))\n"
        "    out = self.bn2.forward(self.conv2.forward(out))\n";
  }
  if (stride != 1 || inplanes != planes * expansion) {
    c.emplace_back("downsample",
                   ScriptSequential(cu, {ScriptConv(cu, inplanes, planes * expansion, 1, stride, 0),
                                         ScriptNorm(cu, planes * expansion)}));
    src += "    return torch.relu(out + self.downsample.forward(x))\n";
  } else {
    src += "    return torch.relu(out + x)\n";
  }
  return Composite(cu, bottleneck ? "Bottleneck" : "BasicBlock", c, src);
}

Module ScriptResNet(const CU& cu, const ModelSpec& s, bool bottleneck,
                    const std::vector<int>& layers) {
  const int64_t expansion = bottleneck ? 4 : 1;
  std::vector<std::pair<std::string, Module>> c = {
      {"conv1", ScriptConv(cu, s.channels, 64, 7, 2, 3)}, {"bn1", ScriptNorm(cu, 64)}};
  int64_t inplanes = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = int64_t{64} << stage;
    std::vector<Module> blocks;
    for (int b = 0; b < layers[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      blocks.push_back(ScriptBlock(cu, bottleneck, inplanes, planes, stride));
      inplanes = planes * expansion;
    }
    c.emplace_back("layer" + std::to_string(stage + 1), ScriptSequential(cu, blocks));
  }
  c.emplace_back("fc", ScriptLinear(cu, 512 * expansion, s.classes));
  return Composite(cu, "ResNet", c, R"(
def forward(self, x):
    x = torch.relu(self.bn1.forward(self.conv1.forward(x)))
    x = torch.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], False)
    x = self.layer1.forward(x)
    x = self.layer2.forward(x)
    x = self.layer3.forward(x)
    x = self.layer4.forward(x)
    x = torch.adaptive_avg_pool2d(x, [1, 1])
    x = torch.flatten(x, 1)
    return self.fc.forward(x)
)");
}

const std::vector<int>& Layers(const std::string& name) {
  static const std::vector<int> r18 = {2, 2, 2, 2}, r34 = {3, 4, 6, 3};
  return name == "resnet18" ? r18 : r34;  // resnet34 and resnet50 share theirs
}

}  // namespace

bool Known(const std::string& name) {
  for (const auto& n : BuiltinModelNames())
    if (n == name) return true;
  return false;
}

torch::nn::AnyModule MakeEager(const ModelSpec& s) {
  if (s.name == "mlp") return torch::nn::AnyModule(Mlp(s.channels * s.height * s.width, s.classes));
  if (s.name == "cnn") return torch::nn::AnyModule(Cnn(s.channels, s.classes));
  return torch::nn::AnyModule(ResNet(s, s.name == "resnet50", Layers(s.name)));
}

torch::jit::Module MakeScript(const ModelSpec& s) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  if (s.name == "mlp") return ScriptMlp(cu, s);
  if (s.name == "cnn") return ScriptCnn(cu, s);
  return ScriptResNet(cu, s, s.name == "resnet50", Layers(s.name));
}

}  // namespace kiln::train::builtin
