// For a kiln built without NCCL (a LibTorch without CUDA, or no nccl.h).
#include "collective_c10d.h"

namespace kiln::train::internal {

bool HaveNccl() { return false; }

Status MakeNcclGroup(const GroupSpec&, const c10::intrusive_ptr<c10d::Store>&,
                     c10::intrusive_ptr<C10dGroup>*) {
  return Status::NotSupported("this kiln was built without NCCL");
}

}  // namespace kiln::train::internal
