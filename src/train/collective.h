// Collective: the process group of a distributed kiln train (internal), and
// what the launcher's environment says about this process.
//
// Launched like torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
// the environment, LOCAL_RANK picking the GPU. Rank 0 hosts the TCPStore.
// The backend follows the training device: NCCL for a CUDA device when
// kiln was built against a CUDA LibTorch that has it, Gloo otherwise when
// Gloo's headers were found (CMake chooses the files: collective_gloo*.cc,
// collective_nccl*.cc). A world size above 1 without a fitting backend is
// an error that says so.
//
// Thread-safety: the blocking operations are used from the training thread
// only; StartAllReduceSum may also be called from LibTorch's autograd
// threads (gradient hooks) while the training thread waits in backward().
#ifndef KILN_SRC_TRAIN_COLLECTIVE_H_
#define KILN_SRC_TRAIN_COLLECTIVE_H_

#include <torch/types.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/launch_env.h"
#include "kiln/status.h"

namespace kiln::train {

// A started collective operation.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Returns once the result may be used by the calling thread: on the CPU
  // when it is there; on a CUDA device when the caller's current stream is
  // ordered after it. Throws DistributedError.
  virtual void Wait() = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // "Gloo" or "NCCL", for messages.
  virtual const char* backend() const = 0;
  // Where StartAllReduceSum's tensors must be: the CPU for Gloo, the
  // rank's GPU for NCCL.
  virtual torch::Device device() const = 0;
  // In place, over all ranks: the sum, the minimum. `t` may be on the CPU
  // or on the training device (a backend that cannot take it there copies
  // it for the operation). Blocking.
  virtual void AllReduceSum(torch::Tensor& t) = 0;
  virtual void AllReduceMin(torch::Tensor& t) = 0;
  // Starts an in-place sum over all ranks of `t`, a dense contiguous tensor
  // on device(), without waiting for it. Every rank must start
  // the same operations in the same order.
  virtual std::unique_ptr<PendingCollective> StartAllReduceSum(torch::Tensor t) = 0;
  // Rank 0's values into every rank's tensors.
  virtual void Broadcast(std::vector<torch::Tensor>& tensors) = 0;
  virtual void Barrier() = 0;
};

// A collective that failed: its message names this rank, the operation and
// the cause (a peer that died or hung, past --dist-timeout). Thrown by the
// Collective's operations; Train() turns it into an IOError.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the launcher's environment says: RANK, WORLD_SIZE, LOCAL_RANK.
// The launcher's RANK, WORLD_SIZE and LOCAL_RANK, read by core's one rule
// (core/launch_env.h), which kiln.Loader follows too.
using Launch = LaunchEnvironment;
inline Status ReadLaunch(Launch* out) { return ReadLaunchEnvironment(out); }

// The training device for --device `option` under `launch`, on a machine
// with `cuda_devices` GPUs (0: none, or a LibTorch without CUDA). Under a
// launcher (LOCAL_RANK set) "cuda", and "auto" where there is a GPU, mean
// cuda:LOCAL_RANK, so each rank of a node has its own GPU; otherwise
// cuda:0. "cuda:N" is taken as given. The result always has an index when
// it is CUDA. InvalidArgument, naming the rank and the device and saying
// what to do, for an unknown name, a GPU this machine lacks, or several
// ranks without LOCAL_RANK asking for "cuda".
Status ChooseDevice(const std::string& option, const Launch& launch, int64_t cuda_devices,
                    torch::Device* out);

// The launcher's process group for training on `device`, or *out = nullptr
// when not distributed. `description` says what was joined. Rendezvous and
// every collective give up after `timeout_seconds`. IOError naming the rank
// when the store cannot be reached or not every rank joins in time;
// NotSupported when this build has no backend for `device`.
Status JoinFromEnvironment(const Launch& launch, const torch::Device& device, int timeout_seconds,
                           std::unique_ptr<Collective>* out, std::string* description);

// What JoinFromEnvironment uses, for tests that run ranks as threads of one
// process: the group of `launch`'s rank over a store at addr:port.
Status JoinGroup(const Launch& launch, const std::string& addr, int port,
                 const torch::Device& device, int timeout_seconds, std::unique_ptr<Collective>* out,
                 std::string* description);

}  // namespace kiln::train

#endif  // KILN_SRC_TRAIN_COLLECTIVE_H_
