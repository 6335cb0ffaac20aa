#include "kiln/train/model.h"

#include <ATen/record_function.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <utility>

#include "builtin_models.h"
#include "core/file.h"

namespace kiln::train {
namespace {

using torch::jit::Module;

// PyTorch's default Linear init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
std::pair<torch::Tensor, torch::Tensor> LinearInit(int64_t in, int64_t out) {
  const double b = 1.0 / std::sqrt(static_cast<double>(in));
  return {torch::empty({out, in}).uniform_(-b, b), torch::empty({out}).uniform_(-b, b)};
}

Module Submodule(const Module& root, const std::string& dotted) {
  Module m = root;
  size_t pos = 0;
  while (pos < dotted.size()) {
    size_t dot = dotted.find('.', pos);
    if (dot == std::string::npos) dot = dotted.size();
    m = m.attr(dotted.substr(pos, dot - pos)).toModule();
    pos = dot + 1;
  }
  return m;
}

// Makes every parameter and buffer of `script` the tensor of the same name
// in `eager` (same shape), so that the TorchScript twin of a built-in model
// saves, loads, moves and freezes what the eager module trains.
// InvalidArgument when the two forms' names or shapes differ (a bug).
Status ShareTensors(torch::nn::Module& eager, Module* script) {
  auto params = eager.named_parameters(true);
  auto buffers = eager.named_buffers(true);
  size_t shared = 0;
  auto share = [&](const std::string& name, bool buffer) -> Status {
    const torch::Tensor* t = buffer ? buffers.find(name) : params.find(name);
    const size_t dot = name.rfind('.');
    Module owner = dot == std::string::npos ? *script : Submodule(*script, name.substr(0, dot));
    const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
    if (t == nullptr || t->sizes() != owner.attr(leaf).toTensor().sizes())
      return Status::InvalidArgument("built-in model: the TorchScript twin's " + name +
                                     " has no eager counterpart of its shape");
    if (buffer) {
      owner.register_buffer(leaf, *t);
    } else {
      owner.register_parameter(leaf, *t, false);
    }
    ++shared;
    return Status::OK();
  };
  std::vector<std::string> names;
  for (const auto& p : script->named_parameters(true)) names.push_back(p.name);
  for (const auto& n : names) KILN_RETURN_IF_ERROR(share(n, false));
  names.clear();
  for (const auto& b : script->named_buffers(true)) names.push_back(b.name);
  for (const auto& n : names) KILN_RETURN_IF_ERROR(share(n, true));
  if (shared != params.size() + buffers.size())
    return Status::InvalidArgument("built-in model: the eager module has tensors its twin lacks");
  return Status::OK();
}

// `name` is `prefix`, or inside it (prefix "layer1" matches "layer1.0.conv1.weight",
// not "layer10.weight").
bool UnderPrefix(const std::string& name, const std::string& prefix) {
  if (prefix.empty() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return name.size() == prefix.size() || prefix.back() == '.' || name[prefix.size()] == '.';
}

// The informative line of a TorchScript error: its last non-empty one
// ("RuntimeError: ..."), not the interpreter's traceback header.
std::string LastLine(const std::string& what) {
  size_t end = what.find_last_not_of(" \n");
  if (end == std::string::npos) return what;
  size_t start = what.rfind('\n', end);
  return what.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
}

// ---- multiply-add counting through RecordFunction ---------------------------

thread_local double g_macs = 0;
thread_local int g_depth = 0;

bool Counted(const char* name) {
  static const char* const kOps[] = {"aten::conv1d", "aten::conv2d", "aten::conv3d",
                                     "aten::convolution", "aten::_convolution", "aten::linear",
                                     "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm"};
  for (const char* op : kOps)
    if (std::strcmp(name, op) == 0) return true;
  return false;
}

double OpMacs(const at::RecordFunction& fn) {
  const std::string name = fn.name();
  auto in = fn.inputs();
  auto tensor = [&](size_t i) -> const at::Tensor* {
    return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr;
  };
  if (name.find("conv") != std::string::npos) {
    const at::Tensor* x = tensor(0);
    const at::Tensor* w = tensor(1);
    if (!x || !w || x->dim() < 3) return 0;
    const int64_t spatial = w->dim() - 2;
    double out_positions = 1;
    for (int64_t d = 0; d < spatial; ++d) {
      auto pick = [&](size_t arg, int64_t fallback) {
        if (arg < in.size() && in[arg].isIntList()) {
          auto v = in[arg].toIntVector();
          if (!v.empty()) return v[std::min<size_t>(d, v.size() - 1)];
        }
        return fallback;
      };
      const int64_t stride = pick(3, 1), pad = pick(4, 0), dil = pick(5, 1);
      const int64_t size = x->size(x->dim() - spatial + d), k = w->size(2 + d);
      out_positions *= static_cast<double>((size + 2 * pad - dil * (k - 1) - 1) / stride + 1);
    }
    const double batch = x->dim() == spatial + 2 ? static_cast<double>(x->size(0)) : 1.0;
    return batch * out_positions * static_cast<double>(w->numel());
  }
  if (name == "aten::linear") {
    const at::Tensor* x = tensor(0);
    const at::Tensor* w = tensor(1);
    if (!x || !w || w->dim() != 2 || w->size(1) == 0) return 0;
    return static_cast<double>(x->numel()) / w->size(1) * w->numel();
  }
  // addmm(bias, a, b), mm(a, b), matmul(a, b), bmm(a, b): a.numel() * b's last size.
  const size_t first = name == "aten::addmm" ? 1 : 0;
  const at::Tensor* a = tensor(first);
  const at::Tensor* b = tensor(first + 1);
  if (!a || !b || b->dim() < 1) return 0;
  return static_cast<double>(a->numel()) * (b->dim() >= 2 ? b->size(-1) : 1);
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  if (Counted(fn.name())) {
    if (g_depth++ == 0) g_macs += OpMacs(fn);  // only the outermost: conv2d -> convolution -> ...
  }
  return nullptr;
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  if (Counted(fn.name())) --g_depth;
}

}  // namespace

const std::vector<std::string>& BuiltinModelNames() {
  static const std::vector<std::string> names = {"mlp", "cnn", "resnet18", "resnet34",
                                                 "resnet50"};
  return names;
}

Status Model::Build(const ModelSpec& spec, Model* out) {
  if (spec.channels <= 0 || spec.height <= 0 || spec.width <= 0 || spec.classes <= 0)
    return Status::InvalidArgument("model " + spec.name + ": the cache's records are not images " +
                                   "of shape [C, H, W] with at least one class");
  if (!builtin::Known(spec.name)) {
    std::string all;
    for (const auto& n : BuiltinModelNames()) all += (all.empty() ? "" : ", ") + n;
    return Status::InvalidArgument("unknown model '" + spec.name + "' (built in: " + all +
                                   "; or give a TorchScript file ending in .pt)");
  }
  torch::manual_seed(spec.seed);
  torch::NoGradGuard no_grad;
  try {
    out->eager_ = builtin::MakeEager(spec);
    out->module_ = builtin::MakeScript(spec);
    KILN_RETURN_IF_ERROR(ShareTensors(*out->eager_.ptr(), &out->module_));
  } catch (const c10::Error& e) {
    return Status::InvalidArgument("model " + spec.name + " could not be built: " +
                                   e.what_without_backtrace());
  }
  out->training_ = true;
  out->frozen_bn_.clear();
  out->FindHead();
  return Status::OK();
}

Status Model::Load(const std::string& path, Model* out) {
  try {
    out->module_ = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    return Status::IOError(path + ": not a loadable TorchScript file (" + what +
                           "); save one from Python with torch.jit.script(model).save(path)");
  }
  for (const auto& p : out->module_.parameters(true)) p.requires_grad_(true);
  out->eager_ = torch::nn::AnyModule();
  out->module_.train(true);
  out->training_ = true;
  out->frozen_bn_.clear();
  out->FindHead();
  return Status::OK();
}

torch::Tensor Model::Forward(const torch::Tensor& x) {
  if (eager()) return eager_.forward(x);
  // Under grad mode, the profiling graph executor would differentiate the
  // graph itself (autodiff subgraphs); without its optimizations each op
  // runs as in eager mode, with autograd's kernels.
  torch::jit::GraphOptimizerEnabledGuard optimize(torch::jit::getGraphExecutorOptimize() &&
                                                  !torch::GradMode::is_enabled());
  c10::IValue y = module_.forward({x});
  if (y.isTuple()) return y.toTuple()->elements().at(0).toTensor();  // e.g. (logits, aux)
  return y.toTensor();
}

void Model::SetTraining(bool on) {
  module_.train(on);
  if (eager()) eager_.ptr()->train(on);
  training_ = on;
  if (!on || frozen_bn_.empty()) return;
  for (const auto& name : frozen_bn_) Submodule(module_, name).train(false);
  if (eager()) {
    auto modules = eager_.ptr()->named_modules();
    for (const auto& name : frozen_bn_) modules[name]->train(false);
  }
}

// Both forms move their tensors in place (set_data), so they stay shared.
void Model::To(const torch::Device& device) {
  if (eager()) eager_.ptr()->to(device);
  module_.to(device);
}

torch::Device Model::device() const {
  for (const auto& p : module_.parameters(true)) return p.device();
  return torch::kCPU;
}

void Model::FindHead() {
  head_.clear();
  for (const auto& m : module_.named_modules()) {
    torch::Tensor w, b;
    for (const auto& p : m.value.named_parameters(false)) {
      if (p.name == "weight") w = p.value;
      if (p.name == "bias") b = p.value;
    }
    if (w.defined() && w.dim() == 2 && (!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0))))
      head_ = m.name;
  }
}

Status Model::ReplaceHead(int64_t classes, uint64_t seed) {
  if (head_.empty())
    return Status::InvalidArgument(
        "--replace-head: the model has no final linear layer (a submodule with a 2-D weight)");
  Module head = Submodule(module_, head_);
  torch::Tensor old_w = head.attr("weight").toTensor();
  torch::manual_seed(seed ^ 0x6865616400000000ULL);
  torch::NoGradGuard no_grad;
  auto [w, b] = LinearInit(old_w.size(1), classes);
  // In place (set_data): a built-in model's eager module holds the same tensors.
  old_w.set_data(w.to(old_w.device()));
  if (head.hasattr("bias") && head.attr("bias").isTensor()) {
    torch::Tensor old_b = head.attr("bias").toTensor();
    if (old_b.defined()) old_b.set_data(b.to(old_b.device()));
  }
  return Status::OK();
}

Status Model::Freeze(const std::vector<std::string>& prefixes, const std::string& until,
                     std::vector<std::string>* frozen) {
  auto params = Parameters(false);
  std::vector<bool> hit(prefixes.size(), false);
  bool until_found = until.empty();
  for (auto& [name, p] : params) {
    bool freeze = false;
    if (!until_found) {
      if (UnderPrefix(name, until)) until_found = true;
      else freeze = true;
    }
    for (size_t i = 0; i < prefixes.size(); ++i)
      if (UnderPrefix(name, prefixes[i])) hit[i] = freeze = true;
    if (freeze) {
      p.requires_grad_(false);
      if (frozen) frozen->push_back(name);
    }
  }
  for (size_t i = 0; i < prefixes.size(); ++i)
    if (!hit[i])
      return Status::InvalidArgument("--freeze " + prefixes[i] +
                                     ": no parameter of the model has that name or prefix "
                                     "(first one: " +
                                     (params.empty() ? std::string("none") : params[0].first) + ")");
  if (!until_found)
    return Status::InvalidArgument("--freeze-until " + until + ": no parameter has that name");
  // BatchNorm layers whose parameters are all frozen keep their running statistics.
  frozen_bn_.clear();
  for (const auto& m : module_.named_modules()) {
    if (m.name.empty() || !m.value.hasattr("running_mean")) continue;
    bool all_frozen = true, any = false;
    for (const auto& p : m.value.parameters(false)) {
      any = true;
      all_frozen = all_frozen && !p.requires_grad();
    }
    if (any && all_frozen) frozen_bn_.push_back(m.name);
  }
  SetTraining(training_);
  return Status::OK();
}

Status Model::InitFrom(const std::string& path, InitReport* report) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "model.pt").string();
  Model src;
  KILN_RETURN_IF_ERROR(Load(file, &src));
  std::map<std::string, torch::Tensor> have;
  for (auto& [n, t] : src.Parameters(false)) have[n] = t;
  for (auto& [n, t] : src.Buffers()) have[n] = t;
  InitReport r;
  torch::NoGradGuard no_grad;
  auto mine = Parameters(false);
  auto bufs = Buffers();
  mine.insert(mine.end(), bufs.begin(), bufs.end());
  for (auto& [name, t] : mine) {
    auto it = have.find(name);
    if (it != have.end() && it->second.sizes() == t.sizes()) {
      t.copy_(it->second);
      r.loaded.push_back(name);
    } else {
      if (it != have.end()) r.skipped.push_back(name + " (shape " + c10::str(it->second.sizes()) +
                                               ", model has " + c10::str(t.sizes()) + ")");
      r.fresh.push_back(name);
    }
    if (it != have.end()) have.erase(it);
  }
  for (const auto& [name, t] : have) r.skipped.push_back(name + " (not in the model)");
  if (r.loaded.empty())
    return Status::InvalidArgument("--init " + path +
                                   ": no parameter matches the model by name and shape");
  if (report) *report = std::move(r);
  return Status::OK();
}

std::vector<std::pair<std::string, torch::Tensor>> Model::Parameters(bool trainable_only) const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : module_.named_parameters(true))
    if (!trainable_only || p.value.requires_grad()) out.emplace_back(p.name, p.value);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> Model::Buffers() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& b : module_.named_buffers(true)) out.emplace_back(b.name, b.value);
  return out;
}

int64_t Model::CountParameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& [name, p] : Parameters(trainable_only)) n += p.numel();
  return n;
}

Status Model::Probe(const std::vector<int64_t>& sample, double* macs, int64_t* outputs) {
  std::vector<int64_t> shape = {1};
  shape.insert(shape.end(), sample.begin(), sample.end());
  const bool was_training = training_;
  SetTraining(false);
  Status st;
  g_macs = 0;
  g_depth = 0;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(OnStart, OnEnd).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  try {
    torch::NoGradGuard no_grad;
    torch::Tensor y = Forward(torch::zeros(shape, torch::TensorOptions().device(device())));
    if (outputs) *outputs = y.dim() >= 2 ? y.size(1) : -1;
  } catch (const std::exception& e) {
    // A c10::Error's what() ends with its C++ backtrace: the message is
    // the text before it (for TorchScript, the interpreter's last line).
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    st = Status::InvalidArgument(
        "the model cannot take an input of shape " + c10::str(c10::IntArrayRef(shape)) + ": " +
        LastLine(c10_error ? c10_error->what_without_backtrace() : e.what()));
  }
  at::removeCallback(handle);
  if (macs) *macs = g_macs;
  SetTraining(was_training);
  return st;
}

Status Model::Save(const std::string& path) {
  const std::string tmp = path + ".tmp";
  try {
    module_.save(tmp);
  } catch (const c10::Error& e) {
    return Status::IOError(path + ": cannot write the model: " + e.what_without_backtrace());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IOError(path + ": " + ec.message());
  return Status::OK();
}

Status Model::SaveStateDict(const std::string& path) const {
  c10::Dict<std::string, torch::Tensor> dict;
  torch::NoGradGuard no_grad;
  // PyTorch's state_dict order: module by module, its parameters, then its buffers.
  for (const auto& m : module_.named_modules()) {
    const std::string prefix = m.name.empty() ? "" : m.name + ".";
    for (const auto& p : m.value.named_parameters(false))
      dict.insert(prefix + p.name, p.value.detach().to(torch::kCPU));
    for (const auto& b : m.value.named_buffers(false))
      dict.insert(prefix + b.name, b.value.detach().to(torch::kCPU));
  }
  // torch::pickle_save's archive, but without the type tags it puts on every
  // dict (torch.jit._pickle.restore_type_tag): torch.load's default since
  // torch 2.6 (weights_only=True) refuses that global, and Python needs no tag.
  std::vector<char> bytes;
  try {
    std::vector<char> pickled;
    torch::jit::Pickler pickler(
        [&](const char* b, size_t n) { pickled.insert(pickled.end(), b, b + n); }, nullptr,
        nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, size_t n) -> size_t {
      const char* c = static_cast<const char*>(b);
      bytes.insert(bytes.end(), c, c + n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(),
                                       pickler.tensorData(), writer);
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    return Status::IOError(path + ": cannot write the state_dict: " + e.what_without_backtrace());
  }
  const std::filesystem::path p(path);
  const std::string name = p.filename().string();
  return WriteFileAtomic(p.has_parent_path() ? p.parent_path().string() : ".", name, name + ".tmp",
                         std::string(bytes.begin(), bytes.end()));
}

Status CheckSameDevice(const Model& model, const torch::Tensor& inputs) {
  const torch::Device m = model.device();
  if (inputs.device() == m) return Status::OK();
  return Status::InvalidArgument("the model is on " + m.str() + " but the first batch is on " +
                                 inputs.device().str() +
                                 ": model and data must share one device (--device)");
}

}  // namespace kiln::train
