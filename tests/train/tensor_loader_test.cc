#include "kiln/train/tensor_loader.h"

#include <dlfcn.h>
#include <torch/cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "device_copy.h"
#include "kiln/cache_writer.h"
#include "train_test_util.h"
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
// A uint8 3x6x6 cache whose manifest records mean/std, as kiln build writes.
void WriteUint8Cache(const std::string& dir, uint64_t n) {
  WriterOptions o;
  o.dtype = DType::kUint8;
  o.shape = MakeShape({3, 6, 6});
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir, &w).ok());
  for (uint64_t i = 0; i < n; ++i) {
    auto p = TestPayload(i, DType::kUint8, 108);
    REQUIRE(w->Append(i, static_cast<int64_t>(i % 4), p.data()).ok());
  }
  Manifest m;
  m.classes = {"a", "b", "c", "d"};
  REQUIRE(Preprocessing::FromJson(
              R"({"mean": [0.5, 0.25, 0.75], "std": [0.5, 0.25, 0.125], "normalized": false})",
              "test", &m.preprocessing)
              .ok());
  REQUIRE(w->Finish(&m).ok());
}
}  // namespace

TEST_CASE("batches arrive as tensors equal to the records, slots reused", "[train]") {
  TempDir dir;
  WriteTestCache(dir.path(), 50, DType::kFloat16, MakeShape({2, 4, 4}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 8;
  o.loader.seed = 4;
  o.dtype = torch::kFloat16;
  o.slots = 3;
  std::unique_ptr<train::TensorLoader> tl;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
  std::vector<void*> ptrs;
  for (const auto& t : tl->slot_tensors()) ptrs.push_back(t.data_ptr());
  auto order = tl->loader().EpochOrder(1);
  auto txn = reader->BeginRead();
  for (int epoch : {0, 1}) {
    REQUIRE(tl->StartEpoch(epoch).ok());
    size_t k = 0;
    torch::Tensor x, y;
    while (tl->Next(&x, &y).ok()) {
      CHECK(x.dim() == 4);
      CHECK(x.size(1) == 2);
      CHECK(x.scalar_type() == torch::kFloat16);
      CHECK(y.scalar_type() == torch::kInt64);
      if (epoch == 1) {
        for (int64_t j = 0; j < x.size(0); ++j, ++k) {
          RecordView v;
          REQUIRE(txn->Get(order[k], &v).ok());
          REQUIRE(std::memcmp(x[j].contiguous().data_ptr(), v.data, v.bytes) == 0);
          REQUIRE(y[j].item<int64_t>() == v.label);
        }
      }
    }
    if (epoch == 1) CHECK(k == 50);
  }
  for (size_t i = 0; i < ptrs.size(); ++i) CHECK(tl->slot_tensors()[i].data_ptr() == ptrs[i]);
  CHECK_FALSE(tl->slot_tensors()[0].is_pinned());  // pinned only for a CUDA device
}

TEST_CASE("loaders that take turns share one host ring, allocated when it must grow", "[train]") {
  TempDir dir;
  WriteTestCache(dir.path(), 40, DType::kFloat16, MakeShape({2, 4, 4}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  auto ring = std::make_shared<train::HostRing>(torch::kCPU);
  CHECK_FALSE(ring->pinned());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 8;
  o.dtype = torch::kFloat16;
  o.slots = 3;
  o.ring = ring;
  std::unique_ptr<train::TensorLoader> a, b;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &a).ok());
  void* first = a->slot_tensors()[0].data_ptr();
  CHECK(ring->allocations() == 1);
  CHECK(ring->bytes() == 3 * (8 * 32 * 2 + 8 * 8));
  // Two open loaders would write the same memory: refused.
  Status s = train::TensorLoader::Open(reader.get(), o, &b);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("held by another open TensorLoader"));
  a.reset();
  o.loader.batch_size = 4;  // smaller: the same memory
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &b).ok());
  CHECK(b->slot_tensors()[0].data_ptr() == first);
  CHECK(ring->allocations() == 1);
  REQUIRE(b->StartEpoch(0).ok());
  torch::Tensor x, y;
  int n = 0;
  while (b->Next(&x, &y).ok()) n += static_cast<int>(x.size(0));
  CHECK(n == 40);
  b.reset();
  o.loader.batch_size = 16;  // larger: it grows, once
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &b).ok());
  CHECK(ring->allocations() == 2);
  CHECK(ring->bytes() == 3 * (16 * 32 * 2 + 16 * 8));
}

TEST_CASE("a uint8 cache is normalized with the manifest's mean and std", "[train]") {
  TempDir dir;
  WriteUint8Cache(dir.path(), 10);
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 10;
  o.loader.shuffle = false;
  o.channels_last = true;
  std::unique_ptr<train::TensorLoader> tl;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
  REQUIRE(tl->StartEpoch(0).ok());
  torch::Tensor x, y;
  REQUIRE(tl->Next(&x, &y).ok());
  CHECK(x.scalar_type() == torch::kFloat32);
  CHECK(x.is_contiguous(torch::MemoryFormat::ChannelsLast));
  const double mean[3] = {0.5, 0.25, 0.75}, stdv[3] = {0.5, 0.25, 0.125};
  auto raw = TestPayload(7, DType::kUint8, 108);
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 36; p += 5) {
      const double want = (raw[c * 36 + p] / 255.0 - mean[c]) / stdv[c];
      REQUIRE(x[7][c][p / 6][p % 6].item<float>() == Approx(want).margin(1e-5));
    }
  CHECK(y[7].item<int64_t>() == 3);
  // Without mean/std a uint8 cache cannot be normalized: a clear error.
  TempDir bare;
  WriteTestCache(bare.path(), 4, DType::kUint8, MakeShape({3, 2, 2}));
  tl.reset();  // a loader must not outlive its reader
  REQUIRE(CacheReader::Open(bare.path(), ReaderOptions(), &reader).ok());
  Status s = train::TensorLoader::Open(reader.get(), o, &tl);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("a mean and a positive std"));
}

// Every batch of two epochs, read back from the device, against the records
// read one by one; with 2 slots every slot is refilled many times while
// copies are in flight.
static void CheckBatchesOn(torch::Device device, bool expect_async) {
  TempDir dir;
  WriteTestCache(dir.path(), 300, DType::kFloat16, MakeShape({3, 8, 8}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 7;
  o.loader.seed = 11;
  o.slots = 2;
  o.device = device;
  o.dtype = torch::kFloat16;
  std::unique_ptr<train::TensorLoader> tl;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
  CHECK(tl->asynchronous() == expect_async);
  auto txn = reader->BeginRead();
  for (int epoch : {0, 1}) {
    const auto order = tl->loader().EpochOrder(epoch);
    REQUIRE(tl->StartEpoch(epoch).ok());
    size_t k = 0;
    torch::Tensor x, y;
    std::vector<torch::Tensor> kept_x, kept_y;  // compared after the epoch, when slots were reused
    // Synchronous copies on the CPU view the slot: keep a copy. Asynchronous
    // ones are kept as handed out.
    const bool views_slot = device.is_cpu() && !expect_async;
    while (tl->Next(&x, &y).ok()) {
      REQUIRE(x.device() == device);
      REQUIRE(y.device() == device);
      kept_x.push_back(views_slot ? x.clone() : x);
      kept_y.push_back(views_slot ? y.clone() : y);
    }
    for (size_t b = 0; b < kept_x.size(); ++b) {
      const torch::Tensor hx = kept_x[b].cpu().contiguous(), hy = kept_y[b].cpu();
      for (int64_t j = 0; j < hx.size(0); ++j, ++k) {
        RecordView v;
        REQUIRE(txn->Get(order[k], &v).ok());
        REQUIRE(std::memcmp(hx[j].data_ptr(), v.data, v.bytes) == 0);
        REQUIRE(hy[j].item<int64_t>() == v.label);
      }
    }
    CHECK(k == 300);
  }
}

TEST_CASE("batches copied to the device equal the records (synchronous copies on the CPU)", "[train]") {
  CheckBatchesOn(torch::kCPU, false);
}

TEST_CASE("kiln-train bench measures the tensor loader against its floors", "[train]") {
  TempDir dir;
  WriteTestCache(dir.path(), 64, DType::kFloat16, MakeShape({3, 16, 16}));
  const std::string kiln = KILN_BIN;
  const std::string train_bin = kiln.substr(0, kiln.rfind('/')) + "/kiln-train";
  std::string out;
  REQUIRE(RunCommand(train_bin + " bench " + dir.path() + " --device cpu --batch 16 --epochs 1", &out) == 0);
  CHECK_THAT(out, Catch::Contains("synchronous copies") && Catch::Contains("epoch 0:") &&
                      Catch::Contains("memcpy floor") && Catch::Contains("loader / floor = "));
  CHECK(RunCommand(kiln + " bench " + dir.path() + " --device tpu", &out) == 2);
  CHECK_THAT(out, Catch::Contains("expected cpu, cuda or cuda:N"));
  // kiln bench hands other devices to kiln-train.
  const int rc = RunCommand(kiln + " bench " + dir.path() + " --device cuda --batch 16 --epochs 1", &out);
  if (torch::cuda::is_available()) {
    CHECK(rc == 0);
    CHECK_THAT(out, Catch::Contains("asynchronous side-stream") &&
                        Catch::Contains("pinned host-to-device floor"));
  } else {
    CHECK(rc == 2);
    CHECK_THAT(out, Catch::Contains("no CUDA device"));
  }
}

namespace {
// A stand-in for the CUDA copier whose copies complete when the test says
// so, as a CUDA event does when the device gets there. Start() queues the
// copy of a slot and returns device tensors not filled yet; HandOff() does
// not wait (a stream wait blocks no host thread); WaitHostRead(slot) blocks
// until the test completes that slot's copies, which read the host slot
// only then. A copy that finds its host slot changed since Start() - a
// refill while the copy was pending - is counted.
class GatedCopier final : public train::internal::DeviceCopier {
 public:
  explicit GatedCopier(int slots) : jobs_(slots) {}
  void Start(int slot, const torch::Tensor& x, const torch::Tensor& y, const train::internal::Convert&,
             torch::Tensor* dx, torch::Tensor* dy) override {
    *dx = torch::empty_like(x);
    *dy = torch::empty_like(y);
    std::lock_guard<std::mutex> lock(mu_);
    jobs_[slot].push_back({x, y, x.clone(), y.clone(), *dx, *dy});
  }
  void HandOff(int, torch::Tensor*, torch::Tensor*) override {}
  void WaitHostRead(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (jobs_[slot].empty()) return;
    waiting_ = slot;
    cv_.notify_all();
    cv_.wait(lock, [&] { return jobs_[slot].empty(); });
  }
  bool asynchronous() const override { return true; }

  // The test's side. The slot whose copy the consumer waits for, once it
  // waits; -1 once `done` is set (then Wake()).
  int Waiter(const std::atomic<bool>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return waiting_ >= 0 || done; });
    return waiting_;
  }
  void Wake() {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  // Whether a pending copy's host slot was written since its Start().
  bool Refilled(int slot) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Job& j : jobs_[slot])
      if (!torch::equal(j.x, j.x_at_start) || !torch::equal(j.y, j.y_at_start)) return true;
    return false;
  }
  void Complete(int slot) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Job& j : jobs_[slot]) {
      if (!torch::equal(j.x, j.x_at_start) || !torch::equal(j.y, j.y_at_start)) ++overwritten_;
      j.dx.copy_(j.x);
      j.dy.copy_(j.y);
    }
    jobs_[slot].clear();
    waiting_ = -1;
    cv_.notify_all();
  }
  int overwritten() const { return overwritten_; }

 private:
  struct Job {
    torch::Tensor x, y, x_at_start, y_at_start, dx, dy;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<Job>> jobs_;
  int waiting_ = -1;
  int overwritten_ = 0;
};
}  // namespace

TEST_CASE("a slot is refilled only after the copy reading it completes (test-controlled copies)",
          "[train]") {
  GatedCopier* copier = nullptr;
  train::internal::SetCopierFactoryForTesting([&](torch::Device, int slots) {
    auto c = std::make_unique<GatedCopier>(slots);
    copier = c.get();
    return c;
  });
  struct Restore {  // the default copiers for the tests after this one, whatever happens
    ~Restore() { train::internal::SetCopierFactoryForTesting(nullptr); }
  } restore;
  TempDir dir;
  WriteTestCache(dir.path(), 60, DType::kFloat16, MakeShape({3, 4, 4}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 7;
  o.loader.seed = 5;
  o.loader.workers = 1;
  o.slots = 2;  // batch b and b + 2 share a slot
  o.dtype = torch::kFloat16;
  std::unique_ptr<train::TensorLoader> tl;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
  REQUIRE(copier != nullptr);
  CHECK(tl->asynchronous());
  // The consumer takes two epochs of batches on a thread of its own; this
  // thread completes each copy once the consumer waits for it, after giving
  // the loader's worker the time to refill the slot, had it been handed back.
  std::atomic<bool> done{false};
  std::vector<std::vector<torch::Tensor>> xs(2), ys(2);
  Status last[2];
  std::thread consumer([&] {
    for (int epoch : {0, 1}) {
      last[epoch] = tl->StartEpoch(epoch);
      torch::Tensor x, y;
      while (last[epoch].ok() && (last[epoch] = tl->Next(&x, &y)).ok()) {
        xs[epoch].push_back(x);
        ys[epoch].push_back(y);
      }
    }
    done = true;
    copier->Wake();
  });
  int completed = 0;
  for (int slot; (slot = copier->Waiter(done)) >= 0; ++completed) {
    for (int i = 0; i < 100 && !copier->Refilled(slot); ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    copier->Complete(slot);
  }
  consumer.join();
  CHECK(completed == 18);  // 9 batches an epoch, each waited for before its slot went back
  CHECK(copier->overwritten() == 0);
  auto txn = reader->BeginRead();
  for (int epoch : {0, 1}) {
    CHECK(last[epoch].IsNotFound());
    const auto order = tl->loader().EpochOrder(epoch);
    size_t k = 0;
    for (size_t b = 0; b < xs[epoch].size(); ++b)
      for (int64_t j = 0; j < xs[epoch][b].size(0); ++j, ++k) {
        RecordView v;
        REQUIRE(txn->Get(order[k], &v).ok());
        REQUIRE(std::memcmp(xs[epoch][b][j].contiguous().data_ptr(), v.data, v.bytes) == 0);
        REQUIRE(ys[epoch][b][j].item<int64_t>() == v.label);
      }
    CHECK(k == 60);
  }
}

namespace {
// A copier whose copies fail with `error` (a c10::Error) from batch `from` on.
class FailingCopier final : public train::internal::DeviceCopier {
 public:
  FailingCopier(int from, std::function<void()> error) : from_(from), error_(std::move(error)) {}
  void Start(int, const torch::Tensor& x, const torch::Tensor& y, const train::internal::Convert&,
             torch::Tensor* dx, torch::Tensor* dy) override {
    if (++started_ > from_) error_();
    *dx = x;
    *dy = y;
  }
  void HandOff(int, torch::Tensor*, torch::Tensor*) override {}
  void WaitHostRead(int) override {}
  bool asynchronous() const override { return false; }

 private:
  int from_, started_ = 0;
  std::function<void()> error_;
};
}  // namespace

TEST_CASE("a failed batch leaves no slot held, and memory exhaustion is thrown, not hidden",
          "[train]") {
  TempDir dir;
  WriteTestCache(dir.path(), 40, DType::kFloat16, MakeShape({2, 4, 4}));
  train::TensorLoaderOptions o;
  o.loader.batch_size = 8;
  o.loader.shuffle = false;
  o.loader.verify_checksums = true;
  o.dtype = torch::kFloat16;
  o.slots = 2;
  std::unique_ptr<CacheReader> reader;
  std::unique_ptr<train::TensorLoader> tl;
  torch::Tensor x, y;
  SECTION("a damaged record") {
    const std::string shard = dir / "shard-00000.mdb";
    FlipByte(shard, PayloadOffset(ReadFile(shard), 20, DType::kFloat16, 64) + 3);
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
    REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
    REQUIRE(tl->StartEpoch(0).ok());
    REQUIRE(tl->Next(&x, &y).ok());
    REQUIRE(tl->Next(&x, &y).ok());
    Status s = tl->Next(&x, &y);  // batch 2: records 16-23
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("record 20"));
    REQUIRE(tl->loader().position().batch == 2);
    // Resuming past it works: the failed batch's slot was not left held.
    REQUIRE(tl->StartEpoch(0, 3).ok());
    int n = 0;
    while (tl->Next(&x, &y).ok()) ++n;
    CHECK(n == 2);
    tl.reset();  // before its reader goes
  }
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  struct Restore {
    ~Restore() { train::internal::SetCopierFactoryForTesting(nullptr); }
  } restore;
  SECTION("a copy that runs out of memory throws, for the batch-size search") {
    train::internal::SetCopierFactoryForTesting([](torch::Device, int) {
      return std::make_unique<FailingCopier>(1, [] {
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB");
      });
    });
    REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
    REQUIRE(tl->StartEpoch(0).ok());
    REQUIRE(tl->Next(&x, &y).ok());
    CHECK_THROWS_AS(tl->Next(&x, &y), c10::OutOfMemoryError);
    CHECK(tl->StartEpoch(1).ok());  // the slot it held goes back
  }
  SECTION("another device error becomes a status that says what failed") {
    train::internal::SetCopierFactoryForTesting([](torch::Device, int) {
      return std::make_unique<FailingCopier>(0, [] {
        TORCH_CHECK(false, "CUDA error: an illegal memory access was encountered");
      });
    });
    REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
    REQUIRE(tl->StartEpoch(0).ok());
    Status s = tl->Next(&x, &y);
    CHECK(s.IsIOError());
    CHECK_THAT(s.message(), Catch::Contains("copying a batch to cpu failed") &&
                                Catch::Contains("illegal memory access"));
    CHECK(tl->StartEpoch(1).ok());
  }
}

namespace {

// The CUDA devices the driver itself reports (dlopen("libcuda.so.1"), as kiln
// doctor does): 0 without a driver. Independent of LibTorch.
int DriverDeviceCount() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<Count>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) n = 0;
  dlclose(lib);
  return n;
}

}  // namespace

TEST_CASE("the build is what CMake chose, and its CUDA answer is the driver's", "[train]") {
  // CMake's KILN_TORCH_CUDA: a CUDA LibTorch gives the side-stream copier and NCCL.
  CHECK(train::BuiltWithCuda() == static_cast<bool>(KILN_EXPECT_TORCH_CUDA));
  // Without a GPU (CI, development machines), the CUDA build says so and the
  // CPU-only one always does; on a GPU machine both answers are yes.
  const int driver = train::BuiltWithCuda() ? DriverDeviceCount() : 0;
  CHECK(torch::cuda::is_available() == (driver > 0));
  CHECK(static_cast<int>(torch::cuda::device_count()) == driver);
  const Status refused = train::CheckCudaDevice(torch::Device(torch::kCUDA, 0), "--device cuda");
  if (driver == 0) {
    CHECK(refused.IsNotSupported());
    CHECK_THAT(refused.message(), Catch::StartsWith("no CUDA device: --device cuda: "));
    CHECK_THAT(refused.message(), Catch::Contains(train::BuiltWithCuda() ? "finds no GPU"
                                                                         : "LibTorch without CUDA"));
  } else {
    CHECK(refused.ok());
  }
  CHECK(train::CheckCudaDevice(torch::Device(torch::kCPU), "--device cpu").ok());
}

TEST_CASE("batches land on the GPU through side-stream copies, equal to the records", "[train][cuda]") {
  if (!CudaDeviceOrSkip()) return;
  CheckBatchesOn(torch::Device(torch::kCUDA, 0), true);
  // A uint8 cache is normalized on the GPU as on the CPU.
  TempDir dir;
  WriteUint8Cache(dir.path(), 64);
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 16;
  o.loader.shuffle = false;
  std::unique_ptr<train::TensorLoader> cpu, gpu;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &cpu).ok());
  o.device = torch::Device(torch::kCUDA, 0);
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &gpu).ok());
  CHECK(gpu->slot_tensors()[0].is_pinned());
  REQUIRE(cpu->StartEpoch(0).ok());
  REQUIRE(gpu->StartEpoch(0).ok());
  torch::Tensor cx, cy, gx, gy;
  while (cpu->Next(&cx, &cy).ok()) {
    REQUIRE(gpu->Next(&gx, &gy).ok());
    CHECK(gx.device().is_cuda());
    CHECK(torch::allclose(gx.cpu(), cx, 1e-5, 1e-5));
    CHECK(torch::equal(gy.cpu(), cy));
  }
  CHECK(gpu->Next(&gx, &gy).IsNotFound());
  CHECK(train::PinnedHostToDeviceBandwidth(torch::Device(torch::kCUDA, 0), 1 << 24, 4) > 0);
}
