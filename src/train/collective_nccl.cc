// c10d's NCCL process group, for ranks that train on CUDA devices (compiled
// only against a CUDA LibTorch whose headers have ProcessGroupNCCL, with
// nccl.h found and USE_C10D_NCCL defined: src/train/CMakeLists.txt).
//
// NCCL's communicator is made at the first collective, on the GPU of its
// tensors (the rank's training device). Two ranks on one GPU are refused by
// NCCL there ("Duplicate GPU"), which Collective reports as such. A
// collective that outlives --dist-timeout is ended by c10d's NCCL watchdog,
// which by default tears the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING).
#include <chrono>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "collective_c10d.h"

namespace kiln::train::internal {

bool HaveNccl() { return true; }

Status MakeNcclGroup(const GroupSpec& spec, const c10::intrusive_ptr<c10d::Store>& store,
                     c10::intrusive_ptr<C10dGroup>* out) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(int64_t{spec.timeout_seconds} * 1000);
  *out = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, spec.rank, spec.world, opts);
  return Status::OK();
}

}  // namespace kiln::train::internal
