// The loader's per-sample writer (core/sample_transform.h): its SIMD kernels
// give the portable code's values, for every output dtype, flip, padding and
// odd width. (Its output against PIL and torchvision: tests/python/test_augment.py.)
#include "core/sample_transform.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

using namespace kiln;
using namespace kiln::internal;

namespace {

std::vector<uint8_t> Output(SampleWriter* w, const std::vector<uint8_t>& img, int h, int wd,
                            const SamplePlan& plan, int out, DType dtype) {
  std::vector<uint8_t> dst(static_cast<size_t>(3) * out * out * DTypeSize(dtype), 0xAB);
  w->Write(img.data(), h, wd, plan, out, out, dst.data());
  return dst;
}

}  // namespace

TEST_CASE("the sample writer's SIMD kernels equal its portable code", "[loader][geometry]") {
  const int h = 37, w = 53;
  std::mt19937 rng(5);
  std::vector<uint8_t> img(static_cast<size_t>(3) * h * w);
  for (auto& v : img) v = static_cast<uint8_t>(rng());
  const std::vector<double> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  for (DType dtype : {DType::kUint8, DType::kFloat16, DType::kFloat32}) {
    SampleWriter writer(3, dtype, mean, std);
    writer.Reserve(h, w, 40);
    for (int k = 0; k < 24; ++k) {
      LoaderOptions o;
      o.random_flip = true;
      o.seed = static_cast<uint64_t>(k);
      o.crop_kind = k % 3 == 0 ? CropKind::kResizeCenter : CropKind::kRandomResized;
      o.resize = k % 2 ? 30 : 45;                // smaller than the crop below: padded
      const int out = k % 4 == 0 ? 40 : 17 + k;  // odd widths: SIMD tails
      const SamplePlan plan = PlanSample(o, static_cast<uint32_t>(out), 0, k, h, w);
      UseSampleKernels(true);
      const std::vector<uint8_t> fast = Output(&writer, img, h, w, plan, out, dtype);
      UseSampleKernels(false);
      const std::vector<uint8_t> portable = Output(&writer, img, h, w, plan, out, dtype);
      UseSampleKernels(true);
      INFO("dtype " << DTypeName(dtype) << ", sample " << k << ", out " << out);
      REQUIRE(fast == portable);
    }
  }
}

TEST_CASE("a window plan copies the stored pixels, flipped when asked", "[loader][geometry]") {
  const int h = 6, w = 9;
  std::vector<uint8_t> img(static_cast<size_t>(3) * h * w);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i);
  SampleWriter writer(3, DType::kUint8, {}, {});
  SamplePlan plan;
  plan.source = plan.box = CropBox{1, 2, 4, 5};
  plan.resized_w = 5;
  plan.resized_h = 4;
  plan.flip = true;
  std::vector<uint8_t> dst(3 * 4 * 5);
  writer.Write(img.data(), h, w, plan, 4, 5, dst.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x)
        CHECK(dst[(c * 4 + y) * 5 + x] == img[(c * h + 1 + y) * w + 2 + (4 - x)]);
}
