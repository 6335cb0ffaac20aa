// Collective over c10d's Gloo backend (compiled when Gloo's headers are found).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdlib>

#include "collective.h"

namespace kiln::train {
namespace {

class GlooCollective : public Collective {
 public:
  GlooCollective(int rank, int world, c10::intrusive_ptr<c10d::Store> store,
                 c10::intrusive_ptr<c10d::ProcessGroupGloo> pg)
      : rank_(rank), world_(world), store_(std::move(store)), pg_(std::move(pg)) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void AllReduceSum(torch::Tensor& t) override {
    Guard("all-reduce (sum)", [&] { Reduce(t, c10d::ReduceOp::SUM); });
  }
  void AllReduceMin(torch::Tensor& t) override {
    Guard("all-reduce (min)", [&] { Reduce(t, c10d::ReduceOp::MIN); });
  }
  void Broadcast(std::vector<torch::Tensor>& tensors) override {
    Guard("broadcast", [&] {
      for (auto& t : tensors) {
        std::vector<at::Tensor> one = {t};
        pg_->broadcast(one)->wait();
      }
    });
  }
  void Barrier() override {
    Guard("barrier", [&] { pg_->barrier()->wait(); });
  }

 private:
  // One tensor per call: Gloo's allreduce of several tensors also sums
  // across them (API_NOTES.md).
  void Reduce(torch::Tensor& t, c10d::ReduceOp op) {
    std::vector<at::Tensor> one = {t};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    pg_->allreduce(one, o)->wait();
  }
  // Runs a collective; its failure becomes a DistributedError that names
  // this rank, the operation and the likely cause.
  template <typename F>
  void Guard(const char* op, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
      what = what.substr(0, what.find('\n'));
      const bool timeout = what.find("imed out") != std::string::npos ||
                           what.find("imeout") != std::string::npos;
      throw DistributedError(
          "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": the " + op +
          " failed: " +
          (timeout ? "a peer rank did not take part within --dist-timeout (hung, or much slower)"
                   : "a peer rank is gone (it exited, crashed or was killed, or the network "
                     "failed)") +
          "; its own log says why. Gloo said: " + what.substr(0, 500));
    }
  }
  int rank_, world_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

Status EnvInt(const char* name, long lo, long hi, long* out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return Status::InvalidArgument(std::string(name) + " is not set");
  char* end = nullptr;
  *out = std::strtol(v, &end, 10);
  if (*end != 0 || *out < lo || *out > hi)
    return Status::InvalidArgument(std::string(name) + "=" + v + " is not a number in " +
                                   std::to_string(lo) + ".." + std::to_string(hi));
  return Status::OK();
}

}  // namespace

Status JoinFromEnvironment(int timeout_seconds, std::unique_ptr<Collective>* out,
                           std::string* description) {
  out->reset();
  if (std::getenv("WORLD_SIZE") == nullptr) return Status::OK();
  long world = 0, rank = 0, port = 0;
  KILN_RETURN_IF_ERROR(EnvInt("WORLD_SIZE", 1, 1 << 16, &world));
  if (world == 1) return Status::OK();
  KILN_RETURN_IF_ERROR(EnvInt("RANK", 0, world - 1, &rank));
  KILN_RETURN_IF_ERROR(EnvInt("MASTER_PORT", 1, 65535, &port));
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr)
    return Status::InvalidArgument("MASTER_ADDR is not set (torchrun sets it; the address of rank 0)");
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = static_cast<size_t>(world);
    so.timeout = std::chrono::seconds(timeout_seconds);
    auto store = c10::make_intrusive<c10d::TCPStore>(addr, so);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = std::chrono::milliseconds(int64_t{timeout_seconds} * 1000);
    // GLOO_SOCKET_IFNAME picks the network interface, as in PyTorch; one
    // machine uses the loopback; otherwise the address the hostname has.
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    const std::string a = addr;
    if (ifname != nullptr)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (a == "127.0.0.1" || a == "localhost")
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                          static_cast<int>(world), opts);
    *out = std::make_unique<GlooCollective>(static_cast<int>(rank), static_cast<int>(world),
                                            store, pg);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
    what = what.substr(0, what.find('\n'));
    const std::string store = std::string(addr) + ":" + std::to_string(port);
    return Status::IOError(
        "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": " +
        (rank == 0 ? "not every rank joined the store at " + store + " within " +
                         std::to_string(timeout_seconds) +
                         " s (--dist-timeout): start all WORLD_SIZE ranks, with the same "
                         "MASTER_ADDR and MASTER_PORT"
                   : "cannot join the store at " + store + " within " +
                         std::to_string(timeout_seconds) +
                         " s (--dist-timeout): is rank 0 running, and are MASTER_ADDR and "
                         "MASTER_PORT rank 0's?") +
        " (" + what.substr(0, 500) + ")");
  }
  *description = "rank " + std::to_string(rank) + " of " + std::to_string(world) + " (Gloo, store " +
                 addr + ":" + std::to_string(port) + ")";
  return Status::OK();
}

}  // namespace kiln::train
