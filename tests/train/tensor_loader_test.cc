#include <torch/cuda.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "device_copy.h"
#include "kiln/cache_writer.h"
#include "kiln/train/tensor_loader.h"
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
  CHECK(tl->slot_tensors()[0].is_pinned() == torch::cuda::is_available());
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
  CHECK_THAT(s.message(), Catch::Contains("mean and std"));
}

// Every batch of two epochs, read back from the device, against the records
// read one by one; with 2 slots every slot is refilled many times while
// copies are in flight. `settle` runs after each epoch's last Next(), before
// the batches are read (a stand-in copier's synchronize).
static void CheckBatchesOn(torch::Device device, bool expect_async,
                           const std::function<void()>& settle = [] {}) {
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
    // ones are kept as handed out, not yet filled.
    const bool views_slot = device.is_cpu() && !expect_async;
    while (tl->Next(&x, &y).ok()) {
      REQUIRE(x.device() == device);
      REQUIRE(y.device() == device);
      kept_x.push_back(views_slot ? x.clone() : x);
      kept_y.push_back(views_slot ? y.clone() : y);
    }
    settle();
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
// An asynchronous stand-in for the CUDA copier, on the CPU: Start() queues
// the copy and returns tensors that a thread of its own fills later, after
// a delay, as a side stream would; HandOff() does not wait (a stream wait
// blocks no host thread); WaitHostRead() blocks until the slot's queued
// copies have read it; Sync() waits for all (the consumer's synchronize).
// It does not convert: use it with the cache's own dtype.
class DelayedCopier final : public train::internal::DeviceCopier {
 public:
  explicit DelayedCopier(int slots) : queued_(slots, 0), done_(slots, 0), thread_([this] { Run(); }) {}
  ~DelayedCopier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Start(int slot, const torch::Tensor& x, const torch::Tensor& y, const train::internal::Convert&,
             torch::Tensor* dx, torch::Tensor* dy) override {
    *dx = torch::empty_like(x);
    *dy = torch::empty_like(y);
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({slot, x, y, *dx, *dy});
    ++queued_[slot];
    cv_.notify_all();
  }
  void HandOff(int, torch::Tensor*, torch::Tensor*) override {}
  void WaitHostRead(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[slot] == queued_[slot]; });
  }
  bool asynchronous() const override { return true; }
  void Sync() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
  }

 private:
  struct Job {
    int slot;
    torch::Tensor x, y, dx, dy;
  };
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      Job job = jobs_.front();
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(500));  // the copy is late
      job.dx.copy_(job.x);
      job.dy.copy_(job.y);
      lock.lock();
      busy_ = false;
      ++done_[job.slot];
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<int> queued_, done_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};
}  // namespace

TEST_CASE("with asynchronous copies a slot is refilled only after the copy has read it", "[train]") {
  DelayedCopier* copier = nullptr;
  train::internal::SetCopierFactoryForTesting([&](torch::Device, int slots) {
    auto c = std::make_unique<DelayedCopier>(slots);
    copier = c.get();
    return c;
  });
  struct Restore {  // the default copiers for the tests after this one, whatever happens
    ~Restore() { train::internal::SetCopierFactoryForTesting(nullptr); }
  } restore;
  CheckBatchesOn(torch::kCPU, true, [&] {
    REQUIRE(copier != nullptr);
    copier->Sync();
  });
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

TEST_CASE("a failed batch leaves no slot held; memory exhaustion is thrown, not hidden", "[train]") {
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

TEST_CASE("batches land on the GPU through side-stream copies, equal to the records", "[train][cuda]") {
  REQUIRE(torch::cuda::is_available());
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
