// DeviceCopier: how TensorLoader moves a batch out of its host slot onto the
// training device (internal to kiln::train).
//
// Protocol, per host slot: Start() begins the copy of the slot's tensors and
// the on-device conversion; HandOff() makes the consumer's current stream
// wait for that batch before it is used; WaitHostRead() blocks until the
// device has read the slot's host memory, after which the loader may refill
// the slot. The CUDA copier works on a side stream fenced with events, so a
// copy overlaps the consumer's compute and compute waits only on its own
// batch; the synchronous copier finishes everything inside Start().
#ifndef KILN_SRC_TRAIN_DEVICE_COPY_H_
#define KILN_SRC_TRAIN_DEVICE_COPY_H_

#include <torch/types.h>

#include <functional>
#include <memory>

namespace kiln::train::internal {

// Applied to the device copy of a batch's inputs (dtype, normalisation,
// memory format); runs where the copy runs.
using Convert = std::function<torch::Tensor(torch::Tensor)>;

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Copies host tensors x, y (the batch in host slot `slot`) to the device
  // and converts the inputs there; *dx, *dy are the device tensors.
  virtual void Start(int slot, const torch::Tensor& x, const torch::Tensor& y,
                     const Convert& convert, torch::Tensor* dx, torch::Tensor* dy) = 0;
  // Makes the calling thread's current stream wait for slot's batch and
  // marks *dx, *dy as used there (so their memory outlives that use).
  virtual void HandOff(int slot, torch::Tensor* dx, torch::Tensor* dy) = 0;
  // Blocks until the device has read slot's host memory.
  virtual void WaitHostRead(int slot) = 0;
  // True when copies run asynchronously to the caller (CUDA).
  virtual bool asynchronous() const = 0;
};

// Side-stream copies with events for `slots` host slots, or nullptr when
// `device` is not CUDA or this kiln was built against a LibTorch without
// CUDA (device_copy_none.cc); TensorLoader then copies synchronously.
std::unique_ptr<DeviceCopier> MakeCudaCopier(torch::Device device, int slots);

// The compute capability of CUDA device `device` (major.minor, e.g. 9.0
// for an H100/H200), or false when this kiln was built against a LibTorch
// without CUDA (device_copy_none.cc). REQUIRES: `device` has an index.
bool CudaCapability(torch::Device device, int* major, int* minor);

// For tests: when set, TensorLoader::Open makes its copier with `factory`
// instead (an asynchronous stand-in on the CPU checks the hand-back
// protocol without a GPU); an empty function restores the default.
using CopierFactory = std::function<std::unique_ptr<DeviceCopier>(torch::Device device, int slots)>;
void SetCopierFactoryForTesting(CopierFactory factory);

}  // namespace kiln::train::internal

#endif  // KILN_SRC_TRAIN_DEVICE_COPY_H_
