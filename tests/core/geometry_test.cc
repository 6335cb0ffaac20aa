// kiln/geometry.h: torchvision's centre-crop offsets and RandomResizedCrop's
// box draw, and the per-sample random streams behind them.
#include "kiln/geometry.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

using namespace kiln;

TEST_CASE("CropOffset rounds half to even and pads a larger crop as torchvision", "[geometry]") {
  CHECK(CropOffset(9, 5) == 2);   // round(2.0)
  CHECK(CropOffset(12, 5) == 4);  // round(3.5) = 4
  CHECK(CropOffset(10, 5) == 2);  // round(2.5) = 2
  CHECK(CropOffset(256, 224) == 16);
  CHECK(CropOffset(5, 9) == -2);  // (9 - 5) // 2 of padding before the image
  CHECK(CropOffset(4, 9) == -2);  // (9 - 4) // 2
}

TEST_CASE("SampleRandom streams depend on (seed, epoch, index) only", "[geometry]") {
  SampleRandom a = SampleRandom::For(1, 2, 3), b = SampleRandom::For(1, 2, 3);
  for (int i = 0; i < 10; ++i) CHECK(a.Next() == b.Next());
  std::set<uint64_t> firsts;
  for (uint64_t seed = 0; seed < 3; ++seed)
    for (uint64_t epoch = 0; epoch < 3; ++epoch)
      for (uint64_t index = 0; index < 3; ++index)
        firsts.insert(SampleRandom::For(seed, epoch, index).Next());
  CHECK(firsts.size() == 27);
  SampleRandom r(9);
  for (int i = 0; i < 1000; ++i) {
    const double u = r.Uniform(0.25, 0.5);
    CHECK((u >= 0.25 && u < 0.5));
    CHECK(r.Below(7) < 7);
  }
}

TEST_CASE("RandomResizedCrop boxes fit their image and follow the ranges", "[geometry]") {
  RandomResizedCropParams p;
  for (int h : {1, 7, 96, 300})
    for (int w : {1, 5, 128, 40}) {
      SampleRandom r = SampleRandom::For(0, 0, static_cast<uint64_t>(h * 1000 + w));
      for (int k = 0; k < 200; ++k) {
        bool fallback = true;
        const CropBox b = RandomResizedCropBox(h, w, p, &r, &fallback);
        INFO(h << "x" << w << ": " << b.top << "," << b.left << " " << b.height << "x" << b.width);
        REQUIRE(b.height >= 1);
        REQUIRE(b.width >= 1);
        REQUIRE(b.top >= 0);
        REQUIRE(b.left >= 0);
        REQUIRE(b.top + b.height <= h);
        REQUIRE(b.left + b.width <= w);
        if (!fallback) {
          // A drawn box: sides rounded from sqrt(A r) and sqrt(A / r), so
          // some r in the range gives w / h within half a pixel per side.
          const double w_ = b.width, h_ = b.height;
          CHECK((w_ + 0.5) / std::max(h_ - 0.5, 1e-9) >= p.ratio_min);
          CHECK((w_ - 0.5) / (h_ + 0.5) <= p.ratio_max);
        }
      }
    }
}

TEST_CASE("RandomResizedCrop's central fallback is torchvision's", "[geometry]") {
  RandomResizedCropParams p;
  SampleRandom r(1);
  bool fallback = false;
  // 1000 x 1: no box of 8% of the area and aspect >= 3/4 fits, every try:
  // the fallback clamps the aspect to 3/4: w = 1, h = round(1 / 0.75) = 1.
  CropBox b = RandomResizedCropBox(1000, 1, p, &r, &fallback);
  CHECK(fallback);
  CHECK(b.width == 1);
  CHECK(b.height == 1);
  CHECK(b.top == 499);
  CHECK(b.left == 0);
  // 10 x 1000 (wide): h = 10, w = round(10 * 4/3) = 13, centred.
  b = RandomResizedCropBox(10, 1000, p, &r, &fallback);
  CHECK(fallback);
  CHECK(b.height == 10);
  CHECK(b.width == 13);
  CHECK(b.left == (1000 - 13) / 2);
  // scale (1, 1) on a square: the whole image, drawn (not the fallback).
  p.scale_min = p.scale_max = 1.0;
  p.ratio_min = p.ratio_max = 1.0;
  b = RandomResizedCropBox(50, 50, p, &r, &fallback);
  CHECK_FALSE(fallback);
  CHECK((b.top == 0 && b.left == 0 && b.height == 50 && b.width == 50));
}

TEST_CASE("RandomResizedCrop's ranges are checked", "[geometry]") {
  RandomResizedCropParams p;
  CHECK(CheckRandomResizedCrop(p).ok());
  p.scale_min = 0.5;
  p.scale_max = 0.2;
  CHECK(CheckRandomResizedCrop(p).IsInvalidArgument());
  p = RandomResizedCropParams();
  p.ratio_min = 0;
  CHECK(CheckRandomResizedCrop(p).IsInvalidArgument());
  p = RandomResizedCropParams();
  p.scale_max = 1.5;
  CHECK(CheckRandomResizedCrop(p).IsInvalidArgument());
}

TEST_CASE("NormalizeTable and FloatToHalf give ToTensor + Normalize's values", "[geometry]") {
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  float table[3][256];
  NormalizeTable(mean, std, 3, table);
  CHECK(table[0][0] == (0.0f - 0.485f) / 0.229f);
  CHECK(table[2][255] == (255.0f / 255.0f - 0.406f) / 0.225f);
  CHECK(FloatToHalf(1.0f) == 0x3C00);
  CHECK(FloatToHalf(-2.0f) == 0xC000);
}

TEST_CASE("ResolutionAt is FFCV's get_resolution: a ramp rounded half to even to steps",
          "[geometry]") {
  ResolutionSchedule s;
  REQUIRE(ParseResolutionSchedule("160:224:2:6", &s).ok());
  CHECK(s.step == 32);
  // Epochs 0-2: 160; then 176, 192, 208 rounded to 32s (5.5 -> 6, 6 -> 6,
  // 6.5 -> 6: half to even, as numpy's round); from 6: 224.
  const uint32_t want[] = {160, 160, 160, 192, 192, 192, 224, 224};
  for (int e = 0; e < 8; ++e) {
    INFO("epoch " << e);
    CHECK(ResolutionAt(s, e) == want[e]);
  }
  REQUIRE(ParseResolutionSchedule("16:32:0:3:8", &s).ok());
  CHECK(ResolutionAt(s, 0) == 16);
  CHECK(ResolutionAt(s, 1) == 24);  // 21.3 / 8 = 2.67 -> 3
  CHECK(ResolutionAt(s, 2) == 24);  // 26.7 / 8 = 3.33 -> 3
  CHECK(ResolutionAt(s, 3) == 32);
  // A bound that is not a multiple of the step: kept within [MIN, MAX].
  REQUIRE(ParseResolutionSchedule("170:200:0:4", &s).ok());
  for (int e = 0; e < 6; ++e) {
    CHECK(ResolutionAt(s, e) >= 170);
    CHECK(ResolutionAt(s, e) <= 200);
  }
  REQUIRE(ParseResolutionSchedule("100:100:3:3", &s).ok());  // no ramp
  CHECK(ResolutionAt(s, 0) == 100);
  CHECK(ResolutionAt(s, 9) == 100);
  for (const char* bad :
       {"", "160", "160:192:0", "160:192:0:2:32:1", "192:160:0:2", "0:160:0:2", "160:192:3:1",
        "160:192:0:2:0", "160:192:-1:2", "a:192:0:2", "160::0:2"}) {
    INFO(bad);
    Status st = ParseResolutionSchedule(bad, &s);
    CHECK(st.IsInvalidArgument());
    CHECK(st.ToString().find("MIN:MAX:START:END") != std::string::npos);
  }
}
