// c10d's Gloo process group (compiled when Gloo's headers are found).
#include <chrono>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "collective_c10d.h"

namespace kiln::train::internal {

bool HaveGloo() { return true; }

Status MakeGlooGroup(const GroupSpec& spec, const c10::intrusive_ptr<c10d::Store>& store,
                     c10::intrusive_ptr<C10dGroup>* out) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = std::chrono::milliseconds(int64_t{spec.timeout_seconds} * 1000);
  // GLOO_SOCKET_IFNAME picks the network interface, as in PyTorch; one
  // machine uses the loopback; otherwise the address the hostname has.
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr)
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (spec.addr == "127.0.0.1" || spec.addr == "localhost")
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  *out = c10::make_intrusive<c10d::ProcessGroupGloo>(store, spec.rank, spec.world, opts);
  return Status::OK();
}

}  // namespace kiln::train::internal
