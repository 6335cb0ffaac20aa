#include <torch/cuda.h>

#include <cstring>

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
  m.preprocessing_json = R"({"mean": [0.5, 0.25, 0.75], "std": [0.5, 0.25, 0.125], "normalized": false})";
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
    while (tl->Next(&x, &y).ok()) {
      REQUIRE(x.device() == device);
      REQUIRE(y.device() == device);
      kept_x.push_back(device.is_cpu() ? x.clone() : x);
      kept_y.push_back(device.is_cpu() ? y.clone() : y);
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
