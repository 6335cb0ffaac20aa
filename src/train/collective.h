// Collective: the process group of a distributed kiln train (internal).
//
// Launched like torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
// the environment (LOCAL_RANK picks the GPU). Rank 0 hosts the TCPStore.
// With Gloo (c10d) when kiln was built against it; without, a world size
// above 1 is an error that says so.
//
// Thread-safety: used from the training thread only.
#ifndef KILN_SRC_TRAIN_COLLECTIVE_H_
#define KILN_SRC_TRAIN_COLLECTIVE_H_

#include <torch/types.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::train {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place, over all ranks: the sum, the minimum.
  virtual void AllReduceSum(torch::Tensor& t) = 0;
  virtual void AllReduceMin(torch::Tensor& t) = 0;
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

// The launcher's process group, or *out = nullptr when WORLD_SIZE is unset
// or 1. `description` says what was joined. Rendezvous and every collective
// give up after `timeout_seconds`. InvalidArgument for a bad environment;
// IOError naming the rank when the store cannot be reached or not every
// rank joins in time; NotSupported when this build has no c10d backend.
Status JoinFromEnvironment(int timeout_seconds, std::unique_ptr<Collective>* out,
                           std::string* description);

}  // namespace kiln::train

#endif  // KILN_SRC_TRAIN_COLLECTIVE_H_
