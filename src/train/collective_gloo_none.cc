// For a kiln built without Gloo's headers (libgloo-dev): no Gloo group.
#include "collective_c10d.h"

namespace kiln::train::internal {

bool HaveGloo() { return false; }

Status MakeGlooGroup(const GroupSpec&, const c10::intrusive_ptr<c10d::Store>&,
                     c10::intrusive_ptr<C10dGroup>*) {
  return Status::NotSupported("this kiln was built without c10d's Gloo backend");
}

}  // namespace kiln::train::internal
