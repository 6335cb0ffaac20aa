// TensorLoader: kiln's Loader with LibTorch tensors as its batch slots.
//
// The slots are host tensors allocated once and reused, from a HostRing
// that loaders used one after another may share; pinned only when the
// batches go to a CUDA device. Next() hands out (inputs, labels) on the training
// device in the training dtype: a uint8 cache is converted and normalized
// there with the manifest's mean/std; a float cache is cast if needed.
//
// Copies: on CUDA (with a CUDA LibTorch) a batch goes to the device on a
// side stream, fenced with events: the caller's current stream waits only
// for its own batch, and a slot is refilled only after the device has read
// it. Elsewhere the copy is synchronous.
//
// Validity: the tensors returned by Next() may view a slot's memory (on the
// CPU, when no conversion is needed); they stay valid until the following
// Next() or StartEpoch() call, which hands the slot back to the workers.
//
// Thread-safety: one consumer thread, as for Loader.
#ifndef KILN_TRAIN_TENSOR_LOADER_H_
#define KILN_TRAIN_TENSOR_LOADER_H_

#include <torch/types.h>

#include <memory>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/loader.h"
#include "kiln/status.h"

namespace kiln::train {

// Host memory for the batch slots of TensorLoaders that run one after
// another (kiln train's batch-size trials, training epochs, evaluations):
// allocated when it must grow and reused otherwise. Page-locked (pinned)
// for a CUDA device, which makes the copies asynchronous, and allocated
// with that device current, so it makes no CUDA context on another GPU;
// ordinary memory otherwise.
//
// Thread-safety: one thread. One TensorLoader holds it at a time
// (TensorLoader::Open refuses a second), so a slot is never written by two
// loaders' workers.
class HostRing {
 public:
  explicit HostRing(torch::Device device);
  // Grows the ring to at least `slots` slots of `data_bytes` bytes and
  // `labels` labels each; reallocates all of it when it grows. REQUIRES: no
  // loader holds the ring. Throws c10::Error when memory is exhausted.
  void Reserve(int slots, int64_t data_bytes, int64_t labels);
  bool pinned() const { return pinned_; }
  // How many times the ring was (re)allocated, and its bytes now.
  int allocations() const { return allocations_; }
  int64_t bytes() const;

 private:
  friend class TensorLoader;
  torch::Device device_;
  bool pinned_;
  std::vector<torch::Tensor> data_, labels_;  // uint8 and int64 buffers, one per slot
  int64_t data_bytes_ = 0, labels_per_slot_ = 0;
  int allocations_ = 0;
  bool held_ = false;  // by an open TensorLoader
};

struct TensorLoaderOptions {
  LoaderOptions loader;                      // order, partition, crop/flip, workers
  int slots = 4;                             // ring size (>= workers + 2 is best)
  torch::Device device = torch::kCPU;        // where batches are delivered
  torch::ScalarType dtype = torch::kFloat32; // training dtype of the inputs
  bool channels_last = false;                // deliver NHWC-strided inputs
  std::shared_ptr<HostRing> ring;            // slot memory to use; nullptr = a ring of its own
};

class TensorLoader {
 public:
  // Returns InvalidArgument for options the cache cannot serve or a ring
  // another loader holds, and Corruption when a uint8 cache's manifest
  // lacks mean/std. Memory exhaustion is thrown as the c10::Error it is.
  static Status Open(const CacheReader* reader, const TensorLoaderOptions& options,
                     std::unique_ptr<TensorLoader>* out);
  // The bytes of one slot's inputs and its number of labels for `options`
  // on `reader` (to Reserve a shared ring for several loaders).
  static void SlotSize(const CacheReader* reader, const TensorLoaderOptions& options,
                       int64_t* data_bytes, int64_t* labels);
  ~TensorLoader();  // hands the ring back

  Status StartEpoch(uint64_t epoch, uint64_t start_batch = 0, uint64_t skip = 0);
  // Between epochs: the output size of a RandomResizedCrop / resize loader
  // from now on (Loader::SetResolution), at most options.loader.max_crop,
  // for which the ring was sized; batches take the new shape.
  Status SetResolution(uint32_t crop);
  // The next batch: inputs [B, C, H, W] (or the record shape with B first),
  // labels int64 [B]. NotFound at the end of the epoch; a record's error as
  // Loader::Next gives it; IOError when the copy to the device fails. Memory
  // exhaustion is thrown as the c10::Error it is (see IsOutOfMemory).
  Status Next(torch::Tensor* inputs, torch::Tensor* labels);

  // Seconds Next() spent waiting for data since the last call of this: for
  // the workers, and on CUDA for the device to finish reading a slot.
  double TakeWaitSeconds();
  Loader& loader() { return *loader_; }
  // True when batches are copied asynchronously (CUDA side stream).
  bool asynchronous() const;
  // The slot tensors, views of the ring (kiln bench measures its floor
  // through the same memory).
  const std::vector<torch::Tensor>& slot_tensors() const { return data_; }
  const HostRing& ring() const { return *ring_; }

 private:
  TensorLoader() = default;
  // Holds the device copier (src/train/device_copy.h): how a batch leaves
  // its host slot. Defined in tensor_loader.cc only.
  struct Copier;
  void ReleaseHeld();  // hands the slot of the last Next() back to the workers
  Status HandBackHeld();  // ReleaseHeld, a failed wait for the copy as an IOError
  Status NextOrThrow(torch::Tensor* inputs, torch::Tensor* labels);
  TensorLoaderOptions opt_;
  const CacheReader* reader_ = nullptr;
  DType out_dtype_ = DType::kUint8;
  std::shared_ptr<HostRing> ring_;
  std::vector<torch::Tensor> data_, labels_;  // views of the ring's slots
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Copier> copier_;
  torch::Tensor mean_, std_;  // [1, C, 1, 1] on the device; undefined when not normalizing
  int held_ = -1;             // the slot handed out by the last Next()
  double wait_ = 0;
};

// True when `e` reports memory exhaustion (CUDA's, or the host allocator's).
bool IsOutOfMemory(const c10::Error& e);

// The host-to-device bandwidth of pinned memory, in bytes/s: `reps` copies
// of `bytes` bytes to `device`, after one untimed warm-up copy. 0 when
// `device` is not CUDA or this kiln was built against a LibTorch without
// CUDA. Throws c10::Error when the CUDA runtime fails.
double PinnedHostToDeviceBandwidth(torch::Device device, int64_t bytes, int reps);

// OK when `device` is not CUDA or a CUDA device is there to use; otherwise
// NotSupported("no CUDA device: OPTION: why"), why saying whether this kiln
// was built against a LibTorch without CUDA (Debian's) or the CUDA LibTorch
// finds no GPU. The one refusal of kiln train, kiln bench --device and the
// trainer's device choice; `option` is what the user asked for
// ("--device cuda").
Status CheckCudaDevice(torch::Device device, const std::string& option);
// That refusal itself, for a caller that knows there is no device.
Status NoCudaDevice(const std::string& option);

// True when this kiln was built against a LibTorch with CUDA (device copies
// on a side stream, NCCL where found); false for Debian's CPU-only one.
bool BuiltWithCuda();

}  // namespace kiln::train

#endif  // KILN_TRAIN_TENSOR_LOADER_H_
