// The launcher's environment and the device it gives a rank; the bucketed
// gradient all-reduce (GradReducer) between two ranks that run as threads
// of this process over Gloo, against the average computed without any
// collective and against one all-reduce per parameter.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>
#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>

#include "collective.h"
#include "grad_reducer.h"
#include "test_skip.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;
using namespace kiln::train::internal;

TEST_CASE("under a launcher --device cuda is the GPU LOCAL_RANK names", "[train][dist]") {
  torch::Device d = torch::kCPU;
  const Launch alone;  // no launcher
  REQUIRE(ChooseDevice("auto", alone, 0, &d).ok());
  CHECK(d == torch::Device(torch::kCPU));
  REQUIRE(ChooseDevice("auto", alone, 2, &d).ok());
  CHECK(d == torch::Device(torch::kCUDA, 0));
  REQUIRE(ChooseDevice("cuda", alone, 2, &d).ok());
  CHECK(d == torch::Device(torch::kCUDA, 0));  // always with an index
  REQUIRE(ChooseDevice("cuda:1", alone, 2, &d).ok());
  CHECK(d == torch::Device(torch::kCUDA, 1));

  Launch torchrun;  // rank 3 of 4, the second process of its machine
  torchrun.rank = 3;
  torchrun.world = 4;
  torchrun.local_rank = 1;
  REQUIRE(ChooseDevice("cuda", torchrun, 2, &d).ok());
  CHECK(d == torch::Device(torch::kCUDA, 1));
  REQUIRE(ChooseDevice("auto", torchrun, 2, &d).ok());
  CHECK(d == torch::Device(torch::kCUDA, 1));
  REQUIRE(ChooseDevice("cuda:0", torchrun, 2, &d).ok());  // given: kept
  CHECK(d == torch::Device(torch::kCUDA, 0));
  REQUIRE(ChooseDevice("cpu", torchrun, 2, &d).ok());
  CHECK(d == torch::Device(torch::kCPU));
  REQUIRE(ChooseDevice("auto", torchrun, 0, &d).ok());
  CHECK(d == torch::Device(torch::kCPU));
  Launch one_process = torchrun;  // torchrun --nproc-per-node 1
  one_process.world = 1;
  one_process.rank = 0;
  one_process.local_rank = 0;
  REQUIRE(ChooseDevice("cuda", one_process, 1, &d).ok());
  CHECK(d == torch::Device(torch::kCUDA, 0));

  // More ranks on a machine than it has GPUs: named, with what to do.
  torchrun.local_rank = 2;
  Status s = ChooseDevice("cuda", torchrun, 2, &d);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("rank 3 of 4") && Catch::Contains("cuda:2") &&
                              Catch::Contains("LOCAL_RANK=2") && Catch::Contains("2 GPU(s)") &&
                              Catch::Contains("--nproc-per-node"));
  // Several ranks, no LOCAL_RANK: each would take GPU 0.
  torchrun.local_rank = -1;
  s = ChooseDevice("cuda", torchrun, 2, &d);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("needs LOCAL_RANK"));
  CHECK_THAT(ChooseDevice("cuda", alone, 0, &d).message(), Catch::Contains("no CUDA"));
  CHECK_THAT(ChooseDevice("tpu", alone, 0, &d).message(),
             Catch::Contains("expected auto, cpu, cuda or cuda:N"));
  CHECK(ChooseDevice("cuda:2", alone, 2, &d).IsInvalidArgument());
}

namespace {
// Sets environment variables for a scope, restoring them after.
class ScopedEnv {
 public:
  void Set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};
}  // namespace

TEST_CASE("the launcher's RANK, WORLD_SIZE and LOCAL_RANK are read and checked", "[train][dist]") {
  ScopedEnv env;
  env.Set("WORLD_SIZE", "4");
  env.Set("RANK", "3");
  env.Set("LOCAL_RANK", "1");
  Launch l;
  REQUIRE(ReadLaunch(&l).ok());
  CHECK((l.rank == 3 && l.world == 4 && l.local_rank == 1));
  env.Set("RANK", "4");
  CHECK_THAT(ReadLaunch(&l).message(), Catch::Contains("RANK=4 is not a number in 0..3"));
  env.Set("LOCAL_RANK", "x");
  CHECK(ReadLaunch(&l).IsInvalidArgument());
  env.Set("LOCAL_RANK", nullptr);
  env.Set("WORLD_SIZE", "1");
  REQUIRE(ReadLaunch(&l).ok());
  CHECK((l.world == 1 && l.rank == 0 && l.local_rank == -1));
}

namespace {

// Random numbers from a generator of the caller's (the ranks are threads).
torch::Tensor Randn(at::IntArrayRef shape, uint64_t seed) {
  return torch::randn(shape, at::detail::createCPUGenerator(seed), torch::TensorOptions());
}

// Five parameters: `unused` no rank uses, `half` only rank 0, the rest all.
struct Net {
  std::vector<torch::Tensor> params;  // unused, half, w1, b1, w2
  explicit Net(torch::Device device = torch::kCPU) {
    uint64_t seed = 7;
    for (auto shape : {std::vector<int64_t>{5}, {3}, {4, 3}, {4}, {2, 4}})
      params.push_back(Randn(shape, seed++).to(device).requires_grad_());
  }
  // This rank's loss on its micro-batch `step`.
  torch::Tensor Loss(int rank, int step) const {
    const torch::Tensor x = Randn({6, 3}, 100 + 10 * rank + step).to(params[0].device());
    torch::Tensor out = torch::tanh(x.matmul(params[2].t()) + params[3]).matmul(params[4].t());
    torch::Tensor loss = out.pow(2).mean();
    if (rank == 0) loss = loss + (x.narrow(0, 0, 1).squeeze(0) * params[1]).sum();
    return loss;
  }
};

// The gradients of every rank's loss, averaged, without any collective:
// undefined where no rank has one. `steps` micro-batches add up.
std::vector<torch::Tensor> ExpectedGradients(int world, int steps) {
  std::vector<torch::Tensor> sum(5);
  for (int r = 0; r < world; ++r) {
    Net net;
    for (int s = 0; s < steps; ++s) net.Loss(r, s).backward();
    for (size_t k = 0; k < 5; ++k) {
      const torch::Tensor g = net.params[k].grad();
      if (g.defined()) sum[k] = sum[k].defined() ? sum[k] + g : g.clone();
    }
  }
  for (auto& t : sum)
    if (t.defined()) t = t / world;
  return sum;
}

struct Outcome {
  std::string error;
  std::vector<torch::Tensor> grads;  // after the reduction (undefined where left alone)
  std::vector<torch::Tensor> plain;  // one all-reduce per parameter
  int started_in_backward = 0, buckets = 0;
  bool stop = false;
  torch::Tensor unused_after_step, unused_before;
};

// Two ranks as threads over Gloo, each running `body`; nullopt when this
// kiln has no Gloo.
std::optional<std::vector<Outcome>> OnTwoRanks(
    const std::function<void(int, Collective&, Outcome*)>& body) {
  const int port = std::stoi(FreeLocalPort());
  std::vector<Outcome> out(2);
  bool no_gloo = false;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Launch l;
      l.rank = r;
      l.world = 2;
      std::unique_ptr<Collective> c;
      std::string description;
      Status s = JoinGroup(l, "127.0.0.1", port, torch::kCPU, 60, &c, &description);
      if (s.IsNotSupported()) no_gloo = true;
      if (!s.ok()) {
        out[r].error = s.ToString();
        return;
      }
      try {
        body(r, *c, &out[r]);
      } catch (const std::exception& e) {
        out[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (no_gloo) {
    SkipWithoutGloo(out[0].error);
    return std::nullopt;
  }
  return out;
}

// One step's reduction on rank `rank`: `steps` micro-batches, the last one
// armed when `arm`, buckets of `bucket_bytes`.
void ReduceStep(int rank, Collective& c, Outcome* o, int64_t bucket_bytes, bool arm, int steps,
                bool stop) {
  Net net;
  GradReducerOptions ro;
  ro.bucket_bytes = ro.first_bucket_bytes = bucket_bytes;
  GradReducer reducer(&c, net.params, ro);
  for (int s = 0; s < steps; ++s) {
    if (arm && s + 1 == steps) reducer.Arm();
    net.Loss(rank, s).backward();
  }
  std::vector<torch::Tensor> local;
  for (auto& p : net.params) local.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  o->stop = reducer.Finish(stop);
  o->started_in_backward = reducer.started_in_backward();
  o->buckets = reducer.buckets();
  for (auto& p : net.params) o->grads.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  // The unbucketed reduction of the same local gradients, for comparison
  // (after the reducer's: every rank must start collectives in one order).
  for (size_t k = 0; k < local.size(); ++k) {
    torch::Tensor sum = local[k].defined() ? local[k] : torch::zeros_like(net.params[k]).detach();
    c.AllReduceSum(sum);
    o->plain.push_back(sum / c.world());
  }
  // Weight decay and momentum leave a parameter without a gradient alone.
  o->unused_before = net.params[0].detach().clone();
  torch::optim::SGD sgd(net.params, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.1));
  sgd.step();
  o->unused_after_step = net.params[0].detach().clone();
}

}  // namespace

TEST_CASE("bucketed gradient all-reduce: the average over ranks, buckets or not, hooks or not",
          "[train][dist]") {
  struct Case {
    const char* name;
    int64_t bucket_bytes;
    bool arm;
    int steps;
  };
  for (const Case& cs : {Case{"a bucket per parameter, started from the hooks", 16, true, 1},
                         Case{"one bucket", 1 << 20, true, 1},
                         Case{"a bucket per parameter, all started after backward", 16, false, 1},
                         Case{"two micro-batches, the last one armed", 16, true, 2}}) {
    SECTION(cs.name) {
      const auto out = OnTwoRanks([&](int r, Collective& c, Outcome* o) {
        ReduceStep(r, c, o, cs.bucket_bytes, cs.arm, cs.steps, /*stop=*/r == 1);
      });
      if (!out) return;
      const std::vector<torch::Tensor> expected = ExpectedGradients(2, cs.steps);
      REQUIRE(!expected[0].defined());  // no rank uses it
      REQUIRE(expected[1].defined());   // rank 0 does
      for (int r = 0; r < 2; ++r) {
        const Outcome& o = (*out)[r];
        INFO("rank " << r << ": " << o.error);
        REQUIRE(o.error.empty());
        CHECK(o.buckets == (cs.bucket_bytes == 16 ? 5 : 1));
        CHECK(o.stop);                      // rank 1 asked to stop: every rank hears it
        CHECK_FALSE(o.grads[0].defined());  // left alone: no gradient anywhere
        CHECK(torch::equal(o.unused_after_step, o.unused_before));
        for (size_t k = 1; k < 5; ++k) {
          INFO("parameter " << k);
          REQUIRE(o.grads[k].defined());
          CHECK(torch::allclose(o.grads[k], expected[k], 1e-6, 1e-7));
          CHECK(torch::equal(o.grads[k], o.plain[k]));  // bucketing changes nothing
        }
        // Buckets start during backward, in order, up to the first one
        // with a missing gradient (never the last): w2, b1, w1, and on
        // rank 0 `half` too.
        if (cs.arm && cs.bucket_bytes == 16) CHECK(o.started_in_backward == (r == 0 ? 4 : 3));
        if (!cs.arm) CHECK(o.started_in_backward == 0);
      }
    }
  }
}

TEST_CASE("one rank over NCCL reduces gradient buckets on the GPU, from the hooks",
          "[train][dist][cuda]") {
  if (!CudaDeviceOrSkip()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  Launch alone;  // a group of one: NCCL's path without a second GPU
  std::unique_ptr<Collective> c;
  std::string description;
  const Status s =
      JoinGroup(alone, "127.0.0.1", std::stoi(FreeLocalPort()), gpu, 60, &c, &description);
  if (s.IsNotSupported()) {
    Skip(SkipWhy::kNotBuilt, "kiln was built without NCCL: " + s.ToString());
    return;
  }
  REQUIRE(s.ok());
  CHECK_THAT(description, Catch::Contains("NCCL on cuda:0"));
  Net net(gpu);
  GradReducerOptions ro;
  ro.bucket_bytes = ro.first_bucket_bytes = 16;
  GradReducer reducer(c.get(), net.params, ro);
  reducer.Arm();
  net.Loss(0, 0).backward();
  std::vector<torch::Tensor> local;
  for (auto& p : net.params) local.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  CHECK(reducer.Finish(true));
  CHECK(reducer.started_in_backward() == 4);
  CHECK_FALSE(net.params[0].grad().defined());
  for (size_t k = 1; k < 5; ++k) CHECK(torch::equal(net.params[k].grad(), local[k]));
  torch::Tensor t = torch::ones({3});  // a CPU tensor goes through the GPU and back
  c->AllReduceSum(t);
  CHECK(torch::equal(t, torch::ones({3})));
  c->Barrier();
}
