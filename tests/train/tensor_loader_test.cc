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

TEST_CASE("batches land on the GPU", "[train][cuda]") {
  REQUIRE(torch::cuda::is_available());
  TempDir dir;
  WriteUint8Cache(dir.path(), 64);
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  train::TensorLoaderOptions o;
  o.loader.batch_size = 16;
  o.device = torch::Device(torch::kCUDA, 0);
  std::unique_ptr<train::TensorLoader> tl;
  REQUIRE(train::TensorLoader::Open(reader.get(), o, &tl).ok());
  REQUIRE(tl->StartEpoch(0).ok());
  torch::Tensor x, y;
  REQUIRE(tl->Next(&x, &y).ok());
  CHECK(x.device().is_cuda());
  CHECK(y.device().is_cuda());
  CHECK(tl->slot_tensors()[0].is_pinned());
}
