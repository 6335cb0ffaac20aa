// The launcher's environment, the device it gives a rank, and the
// Collective over a c10d process group (Gloo or NCCL, made by
// collective_gloo.cc and collective_nccl.cc).
#include "collective.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "collective_c10d.h"
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <optional>

#include "kiln/train/tensor_loader.h"

namespace kiln::train {
namespace internal {
namespace {


std::string Message(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n')).substr(0, 500);
}

// A Collective over a c10d process group. A backend that takes tensors on
// one device only (Gloo: the CPU, NCCL: its GPU) gets copies there.
class C10dCollective final : public Collective {
 public:
  C10dCollective(const GroupSpec& spec, const char* backend, c10::intrusive_ptr<c10d::Store> store,
                 c10::intrusive_ptr<C10dGroup> pg, torch::Device device)
      : rank_(spec.rank),
        world_(spec.world),
        backend_(backend),
        device_(device),
        store_(std::move(store)),
        pg_(std::move(pg)) {}

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  const char* backend() const override { return backend_; }
  torch::Device device() const override { return device_; }

  void AllReduceSum(torch::Tensor& t) override {
    Guard("all-reduce (sum)", [&] { Blocking(t, c10d::ReduceOp::SUM); });
  }
  void AllReduceMin(torch::Tensor& t) override {
    Guard("all-reduce (min)", [&] { Blocking(t, c10d::ReduceOp::MIN); });
  }
  void Broadcast(std::vector<torch::Tensor>& tensors) override {
    Guard("broadcast", [&] {
      for (auto& t : tensors) {
        std::vector<at::Tensor> one = {OnDevice(t)};
        pg_->broadcast(one)->wait();
        if (!one[0].is_same(t)) t.copy_(one[0]);
      }
    });
  }
  // An all-reduce of one number, read on the host: returns when every rank
  // has reached it (c10d's NCCL barrier guesses a GPU from the rank).
  void Barrier() override {
    torch::Tensor t = torch::zeros({1});
    Guard("barrier", [&] { Blocking(t, c10d::ReduceOp::SUM); });
  }

  std::unique_ptr<PendingCollective> StartAllReduceSum(torch::Tensor t) override {
    c10::intrusive_ptr<c10d::Work> work;
    Guard("all-reduce (sum)", [&] {
      TORCH_CHECK(t.device() == device_, "a started all-reduce needs its tensor on ", device_.str(),
                  ", not ", t.device().str());
      std::vector<at::Tensor> one = {t};
      work = pg_->allreduce(one);
    });
    return std::make_unique<Pending>(this, std::move(work));
  }

 private:
  class Pending final : public PendingCollective {
   public:
    Pending(C10dCollective* c, c10::intrusive_ptr<c10d::Work> work)
        : c_(c), work_(std::move(work)) {}
    void Wait() override {
      c_->Guard("all-reduce (sum)", [&] { work_->wait(); });
    }

   private:
    C10dCollective* c_;
    c10::intrusive_ptr<c10d::Work> work_;
  };

  torch::Tensor OnDevice(const torch::Tensor& t) const {
    return t.device() == device_ ? t : t.to(device_);
  }

  // One tensor per call: Gloo's allreduce of several tensors also sums
  // across them (API_NOTES.md).
  void Blocking(torch::Tensor& t, c10d::ReduceOp op) {
    std::vector<at::Tensor> one = {OnDevice(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    pg_->allreduce(one, o)->wait();
    if (!one[0].is_same(t)) t.copy_(one[0]);
  }

  // Runs a collective; its failure becomes a DistributedError that names
  // this rank, the operation and the likely cause.
  template <typename F>
  void Guard(const char* op, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      const std::string what = Message(e);
      const bool timeout =
          what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
      const bool refused = what.find("nvalid usage") != std::string::npos ||
                           what.find("Duplicate GPU") != std::string::npos;
      throw DistributedError(
          "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " (" + device_.str() +
          "): the " + op + " failed: " +
          (timeout   ? "a peer rank did not take part within --dist-timeout (hung, or much slower)"
           : refused ? std::string(backend_) +
                           " refused the group: two ranks on one GPU? Each rank needs its own "
                           "(LOCAL_RANK picks it with --device cuda)"
                     : "a peer rank is gone (it exited, crashed or was killed, or the network "
                       "failed)") +
          "; its own log says why. " + backend_ + " said: " + what);
    }
  }

  int rank_, world_;
  const char* backend_;
  torch::Device device_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<C10dGroup> pg_;
};

}  // namespace
}  // namespace internal


Status ChooseDevice(const std::string& option, const Launch& launch, int64_t cuda_devices,
                    torch::Device* out) {
  const std::string who = launch.world > 1 ? "rank " + std::to_string(launch.rank) + " of " +
                                                 std::to_string(launch.world) + ": "
                                           : "";
  torch::Device d = torch::kCPU;
  if (option == "auto") {
    d = cuda_devices > 0 ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  } else {
    try {
      d = torch::Device(option);
    } catch (const c10::Error&) {
      return Status::InvalidArgument("--device " + option + ": expected auto, cpu, cuda or cuda:N");
    }
    if (!d.is_cpu() && !d.is_cuda())
      return Status::InvalidArgument("--device " + option + ": expected auto, cpu, cuda or cuda:N");
  }
  if (d.is_cuda() && cuda_devices == 0) return NoCudaDevice(who + "--device " + option);
  if (d.is_cuda() && !d.has_index()) {
    if (launch.local_rank >= 0) {
      d = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
    } else if (launch.world > 1) {
      return Status::InvalidArgument(
          who + "--device " + option +
          " with several ranks needs LOCAL_RANK (torchrun sets it) to give each rank of a machine "
          "its own GPU: set LOCAL_RANK, or give each rank --device cuda:N");
    } else {
      d = torch::Device(torch::kCUDA, 0);
    }
  }
  if (d.is_cuda() && d.index() >= cuda_devices)
    return Status::InvalidArgument(
        who + "--device " + option + " means " + d.str() + " (" +
        (launch.local_rank >= 0 && option.find(':') == std::string::npos
             ? "LOCAL_RANK=" + std::to_string(launch.local_rank)
             : std::string("as given")) +
        "), but this machine has " + std::to_string(cuda_devices) +
        " GPU(s): start at most that many ranks per machine (torchrun --nproc-per-node), or "
        "give --device cuda:N with N below " +
        std::to_string(cuda_devices));
  *out = d;
  return Status::OK();
}

namespace {
// Whether NCCL serves `device` in this build (else Gloo does); NotSupported
// when neither backend can.
Status ChooseBackend(int world, const torch::Device& device, bool* nccl) {
  *nccl = device.is_cuda() && internal::HaveNccl();
  if (*nccl || internal::HaveGloo()) return Status::OK();
  return Status::NotSupported(
      "WORLD_SIZE=" + std::to_string(world) + " on " + device.str() +
      ": this kiln was built without c10d's Gloo backend (Gloo's headers, libgloo-dev, were not "
      "found)" +
      (device.is_cuda() ? std::string(" and without NCCL")
                        : std::string(internal::HaveNccl()
                                          ? "; its NCCL serves CUDA devices only (--device cuda)"
                                          : "")) +
      ", so it trains in one process only");
}
}  // namespace

Status JoinGroup(const Launch& launch, const std::string& addr, int port,
                 const torch::Device& device, int timeout_seconds, std::unique_ptr<Collective>* out,
                 std::string* description) {
  out->reset();
  const int rank = launch.rank, world = launch.world;
  bool nccl = false;
  KILN_RETURN_IF_ERROR(ChooseBackend(world, device, &nccl));
  internal::GroupSpec spec;
  spec.rank = rank;
  spec.world = world;
  spec.timeout_seconds = timeout_seconds;
  spec.addr = addr;
  spec.device = device;
  const char* backend = nccl ? "NCCL" : "Gloo";
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = static_cast<size_t>(world);
    so.timeout = std::chrono::seconds(timeout_seconds);
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(addr, so);
    c10::intrusive_ptr<internal::C10dGroup> pg;
    KILN_RETURN_IF_ERROR(nccl ? internal::MakeNcclGroup(spec, store, &pg)
                              : internal::MakeGlooGroup(spec, store, &pg));
    *out = std::make_unique<internal::C10dCollective>(spec, backend, store, pg,
                                                      nccl ? device : torch::Device(torch::kCPU));
  } catch (const std::exception& e) {
    const std::string at = addr + ":" + std::to_string(port);
    return Status::IOError(
        "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": " +
        (rank == 0
             ? "not every rank joined the store at " + at + " within " +
                   std::to_string(timeout_seconds) +
                   " s (--dist-timeout): start all WORLD_SIZE ranks, with the same "
                   "MASTER_ADDR and MASTER_PORT"
             : "cannot join the store at " + at + " within " + std::to_string(timeout_seconds) +
                   " s (--dist-timeout): is rank 0 running, and are MASTER_ADDR and "
                   "MASTER_PORT rank 0's?") +
        " (" + internal::Message(e) + ")");
  }
  *description = "rank " + std::to_string(rank) + " of " + std::to_string(world) + " (" + backend +
                 " on " + device.str() + ", store " + addr + ":" + std::to_string(port) + ")";
  return Status::OK();
}

Status JoinFromEnvironment(const Launch& launch, const torch::Device& device, int timeout_seconds,
                           std::unique_ptr<Collective>* out, std::string* description) {
  out->reset();
  if (launch.world == 1) return Status::OK();
  bool nccl = false;
  KILN_RETURN_IF_ERROR(ChooseBackend(launch.world, device, &nccl));
  long port = 0;
  KILN_RETURN_IF_ERROR(LaunchVariable("MASTER_PORT", 1, 65535, &port));
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr)
    return Status::InvalidArgument(
        "MASTER_ADDR is not set (torchrun sets it; the address of rank 0)");
  return JoinGroup(launch, addr, static_cast<int>(port), device, timeout_seconds, out, description);
}

}  // namespace kiln::train
