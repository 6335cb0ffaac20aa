#include "kiln/train/tensor_loader.h"

#include <c10/core/DeviceGuard.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>

#include "device_copy.h"

namespace kiln::train {

namespace internal {
namespace {

// Blocking copies: .to(device) returns when the copy is done (on the CPU it
// returns the slot's own tensor, so the batch views the slot, as Next()'s
// contract allows).
class SyncCopier final : public DeviceCopier {
 public:
  explicit SyncCopier(torch::Device device) : device_(device) {}
  void Start(int, const torch::Tensor& x, const torch::Tensor& y, const Convert& convert,
             torch::Tensor* dx, torch::Tensor* dy) override {
    *dx = convert(x.to(device_, /*non_blocking=*/false));
    *dy = y.to(device_, /*non_blocking=*/false);
  }
  void HandOff(int, torch::Tensor*, torch::Tensor*) override {}
  void WaitHostRead(int) override {}
  bool asynchronous() const override { return false; }

 private:
  torch::Device device_;
};

CopierFactory& TestFactory() {
  static CopierFactory factory;
  return factory;
}

// The copier for `device`: side-stream copies on CUDA where this LibTorch
// has CUDA, blocking copies otherwise (or the test's stand-in).
std::unique_ptr<DeviceCopier> MakeCopier(torch::Device device, int slots) {
  if (TestFactory()) return TestFactory()(device, slots);
  std::unique_ptr<DeviceCopier> c = MakeCudaCopier(device, slots);
  if (c) return c;
  return std::make_unique<SyncCopier>(device);
}

}  // namespace

void SetCopierFactoryForTesting(CopierFactory factory) { TestFactory() = std::move(factory); }

}  // namespace internal

struct TensorLoader::Copier {
  std::unique_ptr<internal::DeviceCopier> device;
};

namespace {
torch::ScalarType CacheScalarType(DType d) {
  switch (d) {
    case DType::kUint8: return torch::kUInt8;
    case DType::kFloat16: return torch::kFloat16;
    case DType::kFloat32: return torch::kFloat32;
    case DType::kInt32:
      return torch::kInt32;
    case DType::kInt64:
      return torch::kInt64;
  }
  return torch::kUInt8;
}

// The batch shape: the loader's output sample (kiln::LoaderOutputShape:
// the record shape after the crop), batch first. Empty when the loader
// would refuse the options (Open then says why).
std::vector<int64_t> BatchShape(const Manifest& m, const TensorLoaderOptions& options) {
  Shape sample;
  if (!LoaderOutputShape(m, options.loader, &sample).ok()) return {};
  std::vector<int64_t> shape{static_cast<int64_t>(options.loader.batch_size)};
  for (int i = 0; i < sample.ndim; ++i) shape.push_back(sample.dims[i]);
  return shape;
}

// Bytes of a batch of `shape` in `dtype` (0 for an empty shape: options the
// loader refuses).
int64_t BatchBytes(const std::vector<int64_t>& shape, DType dtype) {
  if (shape.empty()) return 0;
  int64_t n = static_cast<int64_t>(DTypeSize(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

// A slot of the ring (bytes) viewed as a batch of `shape` in `dtype`.
torch::Tensor BatchView(const torch::Tensor& slot, const std::vector<int64_t>& shape, DType dtype) {
  return slot.narrow(0, 0, BatchBytes(shape, dtype)).view(CacheScalarType(dtype)).view(shape);
}

// The element type of the loader's output (the records').
DType OutputDType(const Manifest& m, const TensorLoaderOptions& options) {
  DType d = m.dtype;
  (void)LoaderOutputDType(m, options.loader, &d);
  return d;
}
}  // namespace

bool IsOutOfMemory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  const std::string what = e.what_without_backtrace();
  return what.find("out of memory") != std::string::npos ||
         what.find("not enough memory") != std::string::npos ||
         what.find("can't allocate memory") != std::string::npos;  // LibTorch's CPU allocator
}

HostRing::HostRing(torch::Device device)
    : device_(device), pinned_(device.is_cuda() && torch::cuda::is_available()) {}

void HostRing::Reserve(int slots, int64_t data_bytes, int64_t labels) {
  if (slots <= static_cast<int>(data_.size()) && data_bytes <= data_bytes_ &&
      labels <= labels_per_slot_)
    return;
  TORCH_CHECK(!held_, "HostRing::Reserve while a TensorLoader holds the ring");
  slots = std::max<int>(slots, static_cast<int>(data_.size()));
  data_bytes = std::max(data_bytes, data_bytes_);
  labels = std::max(labels, labels_per_slot_);
  data_.clear();  // the old memory goes first
  labels_.clear();
  data_bytes_ = labels_per_slot_ = 0;
  // Pinned memory is allocated in the CUDA context of the current device:
  // the training device's, not GPU 0's.
  c10::OptionalDeviceGuard guard;
  if (pinned_) guard.reset_device(device_);
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(pinned_);
  const auto ints = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(pinned_);
  for (int i = 0; i < slots; ++i) {
    data_.push_back(torch::empty({data_bytes}, bytes));
    labels_.push_back(torch::empty({labels}, ints));
  }
  data_bytes_ = data_bytes;
  labels_per_slot_ = labels;
  ++allocations_;
}

int64_t HostRing::bytes() const {
  return static_cast<int64_t>(data_.size()) * (data_bytes_ + labels_per_slot_ * 8);
}

TensorLoader::~TensorLoader() {
  try {
    if (held_ >= 0 && copier_) copier_->device->WaitHostRead(held_);
  } catch (const std::exception&) {  // a failed device: its copy is not running either
  }
  loader_.reset();  // join the workers before the slot memory goes
  if (ring_) ring_->held_ = false;
}

void TensorLoader::SlotSize(const CacheReader* reader, const TensorLoaderOptions& options,
                            int64_t* data_bytes, int64_t* labels) {
  TensorLoaderOptions largest = options;  // the ring holds the largest resolution
  largest.loader.crop = std::max(options.loader.crop, options.loader.max_crop);
  *data_bytes =
      BatchBytes(BatchShape(reader->manifest(), largest), OutputDType(reader->manifest(), options));
  *labels = static_cast<int64_t>(options.loader.batch_size);
}

Status TensorLoader::Open(const CacheReader* reader, const TensorLoaderOptions& options,
                          std::unique_ptr<TensorLoader>* out) {
  if (options.slots < 1) return Status::InvalidArgument("tensor loader: need at least one slot");
  std::shared_ptr<HostRing> ring =
      options.ring ? options.ring : std::make_shared<HostRing>(options.device);
  if (ring->held_)
    return Status::InvalidArgument(
        "tensor loader: its host ring is held by another open TensorLoader; close that one first");
  std::unique_ptr<TensorLoader> t(new TensorLoader());
  t->opt_ = options;
  const Manifest& m = reader->manifest();
  Shape sample;
  KILN_RETURN_IF_ERROR(LoaderOutputShape(m, options.loader, &sample));
  const std::vector<int64_t> shape = BatchShape(m, options);
  const DType out_dtype = OutputDType(m, options);
  int64_t data_bytes = 0, labels = 0;
  SlotSize(reader, options, &data_bytes, &labels);
  ring->Reserve(options.slots, data_bytes, labels);
  ring->held_ = true;
  t->ring_ = ring;
  t->reader_ = reader;
  t->out_dtype_ = out_dtype;
  std::vector<BatchSlot> slots;
  for (int i = 0; i < options.slots; ++i) {
    t->data_.push_back(BatchView(ring->data_[i], shape, out_dtype));  // at the current size
    t->labels_.push_back(ring->labels_[i].narrow(0, 0, labels));
    slots.push_back({t->data_.back().data_ptr(), t->labels_.back().data_ptr<int64_t>()});
  }
  KILN_RETURN_IF_ERROR(Loader::Open(reader, options.loader, std::move(slots), &t->loader_));
  try {
    t->copier_ = std::make_unique<Copier>();
    t->copier_->device = internal::MakeCopier(options.device, options.slots);
  } catch (const std::exception& e) {
    return Status::IOError(std::string("tensor loader: cannot set up copies to ") +
                           options.device.str() + ": " + e.what());
  }
  if (out_dtype == DType::kUint8) {
    // Raw pixels: (x/255 - mean) / std on the device, from the manifest.
    std::vector<double> mean, std;
    KILN_RETURN_IF_ERROR(InputNormalization(m, reader->dir(), &mean, &std));
    const int64_t c = sample.ndim == 3 ? sample.dims[0] : 0;
    if (c == 0 || static_cast<int64_t>(mean.size()) != c || static_cast<int64_t>(std.size()) != c)
      return Status::Corruption(reader->dir() + ": a uint8 cache needs per-channel mean and std in "
                                "its manifest's preprocessing to be normalized");
    auto f = torch::TensorOptions().dtype(torch::kFloat32);
    t->mean_ = torch::tensor(mean, f).view({1, c, 1, 1}).to(options.device, options.dtype);
    t->std_ = torch::tensor(std, f).view({1, c, 1, 1}).to(options.device, options.dtype);
  }
  *out = std::move(t);
  return Status::OK();
}

void TensorLoader::ReleaseHeld() {
  if (held_ < 0) return;
  // An asynchronous copy may still be reading the slot's host memory.
  copier_->device->WaitHostRead(held_);
  loader_->Release(held_);
  held_ = -1;
}

Status TensorLoader::HandBackHeld() {
  try {
    ReleaseHeld();
  } catch (const std::exception& e) {
    return Status::IOError(std::string("tensor loader: waiting for the copy to ") +
                           opt_.device.str() + " failed: " + e.what());
  }
  return Status::OK();
}

Status TensorLoader::StartEpoch(uint64_t epoch, uint64_t start_batch, uint64_t skip) {
  KILN_RETURN_IF_ERROR(HandBackHeld());
  return loader_->StartEpoch(epoch, start_batch, skip);
}

Status TensorLoader::SetResolution(uint32_t crop) {
  KILN_RETURN_IF_ERROR(HandBackHeld());
  KILN_RETURN_IF_ERROR(loader_->SetResolution(crop));
  opt_.loader.crop = crop;
  const std::vector<int64_t> shape = BatchShape(reader_->manifest(), opt_);
  for (size_t i = 0; i < data_.size(); ++i)
    data_[i] = BatchView(ring_->data_[i], shape, out_dtype_);
  return Status::OK();
}

bool TensorLoader::asynchronous() const { return copier_->device->asynchronous(); }

Status TensorLoader::Next(torch::Tensor* inputs, torch::Tensor* labels) {
  try {
    return NextOrThrow(inputs, labels);
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;  // for callers that size batches by trying them
    return Status::IOError(std::string("tensor loader: copying a batch to ") + opt_.device.str() +
                           " failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::IOError(std::string("tensor loader: copying a batch to ") + opt_.device.str() +
                           " failed: " + e.what());
  }
}

Status TensorLoader::NextOrThrow(torch::Tensor* inputs, torch::Tensor* labels) {
  // Waiting for the device to finish reading the last slot counts as
  // waiting for data, as does waiting for the workers.
  const auto t0 = std::chrono::steady_clock::now();
  ReleaseHeld();
  Batch b;
  Status s = loader_->Next(&b);
  wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) return s;  // the core loader holds no slot then
  held_ = b.slot;
  const int64_t n = static_cast<int64_t>(b.size);
  const torch::Tensor x = data_[b.slot].narrow(0, 0, n);
  const torch::Tensor y = labels_[b.slot].narrow(0, 0, n);
  // Runs on the device, where the copy runs (the side stream on CUDA).
  const internal::Convert convert = [this](torch::Tensor v) {
    if (mean_.defined()) {
      v = v.to(opt_.dtype).div_(255.0).sub_(mean_).div_(std_);
    } else if (v.scalar_type() != opt_.dtype) {
      v = v.to(opt_.dtype);
    }
    if (opt_.channels_last && v.dim() == 4) v = v.contiguous(torch::MemoryFormat::ChannelsLast);
    return v;
  };
  copier_->device->Start(b.slot, x, y, convert, inputs, labels);
  copier_->device->HandOff(b.slot, inputs, labels);
  return Status::OK();
}

double TensorLoader::TakeWaitSeconds() {
  const double w = wait_;
  wait_ = 0;
  return w;
}

Status CheckCudaDevice(torch::Device device, const std::string& option) {
  if (!device.is_cuda() || torch::cuda::is_available()) return Status::OK();
  return NoCudaDevice(option);
}

}  // namespace kiln::train
