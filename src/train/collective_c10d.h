// The c10d backends behind Collective (internal to collective*.cc): each
// backend file makes its process group, collective.cc wraps it. CMake
// compiles either a backend's file or its *_none.cc stand-in, which says
// the backend is missing from this build.
#ifndef KILN_SRC_TRAIN_COLLECTIVE_C10D_H_
#define KILN_SRC_TRAIN_COLLECTIVE_C10D_H_

#include <c10/util/intrusive_ptr.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif
#include <torch/types.h>

#include <string>

#include "kiln/status.h"

namespace c10d {
class Store;
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace kiln::train::internal {

// The class c10d's Gloo and NCCL groups derive from: Backend since 2.0,
// ProcessGroup before.
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

struct GroupSpec {
  int rank = 0, world = 1;
  int timeout_seconds = 300;           // every collective (--dist-timeout)
  std::string addr;                    // MASTER_ADDR
  torch::Device device = torch::kCPU;  // the training device (NCCL's GPU)
};

// Whether this build has the backend; its process group over `store`.
// Throws c10::Error (or std::exception) when the group cannot be formed.
bool HaveGloo();
Status MakeGlooGroup(const GroupSpec& spec, const c10::intrusive_ptr<c10d::Store>& store,
                     c10::intrusive_ptr<C10dGroup>* out);
bool HaveNccl();
Status MakeNcclGroup(const GroupSpec& spec, const c10::intrusive_ptr<c10d::Store>& store,
                     c10::intrusive_ptr<C10dGroup>* out);

}  // namespace kiln::train::internal

#endif  // KILN_SRC_TRAIN_COLLECTIVE_C10D_H_
