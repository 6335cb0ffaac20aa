// Tests for kiln::image transforms: torchvision geometry and rounding,
// PIL's resampling arithmetic, and the CHW/normalisation/fp16 output.
#include "kiln/image/transform.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kiln::image {
namespace {

ImageU8 MakeImage(int w, int h, int c, uint8_t (*value)(int x, int y, int ch)) {
  ImageU8 img;
  img.width = w;
  img.height = h;
  img.channels = c;
  img.pixels.resize(static_cast<size_t>(w) * h * c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        img.pixels[(static_cast<size_t>(y) * w + x) * c + k] = value(x, y, k);
  return img;
}

ResizeSpec Spec(int shorter, int crop) {
  ResizeSpec s;
  s.resize_shorter = shorter;
  s.crop = crop;
  return s;
}

TEST_CASE("PlanResize follows torchvision's Resize(S) rounding", "[transform]") {
  struct Case {
    int w, h, s, want_w, want_h;
  };
  const Case cases[] = {
      {500, 375, 256, 341, 256},   {375, 500, 256, 256, 341},  {640, 480, 256, 341, 256},
      {1000, 1000, 256, 256, 256}, {257, 1000, 224, 224, 871}, {333, 256, 256, 333, 256},
      {1920, 1080, 256, 455, 256}, {100, 50, 256, 512, 256},   {3, 7, 2, 2, 4}};
  for (const Case& c : cases) {
    INFO(c.w << "x" << c.h << " S=" << c.s);
    int w, h;
    REQUIRE(PlanResize(c.w, c.h, Spec(c.s, 0), &w, &h).ok());
    CHECK(w == c.want_w);
    CHECK(h == c.want_h);
  }
  int w, h;
  REQUIRE(PlanGeometry(500, 375, Spec(256, 224), &w, &h).ok());
  CHECK((w == 224 && h == 224));
  ResizeSpec squash;
  squash.squash_w = 64;
  squash.squash_h = 32;
  REQUIRE(PlanGeometry(500, 375, squash, &w, &h).ok());
  CHECK((w == 64 && h == 32));
  squash.resize_shorter = 10;
  CHECK(PlanGeometry(500, 375, squash, &w, &h).IsInvalidArgument());
  CHECK(PlanGeometry(0, 375, Spec(256, 0), &w, &h).IsInvalidArgument());
  ResizeSpec half;
  half.squash_w = 3;
  CHECK(PlanGeometry(5, 5, half, &w, &h).IsInvalidArgument());
}

TEST_CASE("PlanResize's max_side follows torchvision's Resize(S, max_size), and bounds alone",
          "[transform]") {
  struct Case {
    int w, h, s, max, want_w, want_h;
  };
  // With S: torchvision 0.14's F.resize(img, S, max_size=N) sizes (checked
  // in Python for 1920x1080 and 1080x1920); without S the same rule on the
  // image as it is; smaller images unchanged; the shorter side at least 1.
  const Case cases[] = {{1920, 1080, 256, 400, 400, 225}, {1080, 1920, 256, 400, 225, 400},
                        {500, 375, 0, 256, 256, 192},     {375, 500, 0, 256, 192, 256},
                        {200, 100, 0, 256, 200, 100},     {3000, 1, 0, 256, 256, 1},
                        {256, 256, 0, 256, 256, 256},     {640, 480, 256, 512, 341, 256}};
  for (const Case& c : cases) {
    INFO(c.w << "x" << c.h << " S=" << c.s << " max=" << c.max);
    ResizeSpec spec = Spec(c.s, 0);
    spec.max_side = c.max;
    int w, h;
    REQUIRE(PlanResize(c.w, c.h, spec, &w, &h).ok());
    CHECK(w == c.want_w);
    CHECK(h == c.want_h);
  }
  ResizeSpec bad = Spec(256, 0);
  bad.max_side = 256;  // torchvision: max_size must exceed the size
  int w, h;
  CHECK(PlanResize(500, 375, bad, &w, &h).IsInvalidArgument());
}

TEST_CASE("CenterCrop offset is int(round((size - crop) / 2.0)), half to even", "[transform]") {
  // Pixel value = x coordinate, so the first output pixel tells the offset.
  auto by_x = [](int x, int, int) { return static_cast<uint8_t>(x); };
  auto by_y = [](int, int y, int) { return static_cast<uint8_t>(y); };
  struct Case {
    int size, crop, offset;
  };
  // (size - crop) / 2: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4, 2 -> 2.
  const Case cases[] = {{5, 4, 0}, {7, 4, 2}, {9, 4, 2}, {11, 4, 4}, {8, 4, 2}, {4, 4, 0}};
  for (const Case& c : cases) {
    INFO("size " << c.size << " crop " << c.crop);
    ImageU8 out;
    REQUIRE(ResizeAndCrop(MakeImage(c.size, c.size + 2, 1, by_x), Spec(0, c.crop), &out).ok());
    REQUIRE(out.width == c.crop);
    CHECK(out.pixels[0] == c.offset);
    REQUIRE(ResizeAndCrop(MakeImage(c.size + 2, c.size, 1, by_y), Spec(0, c.crop), &out).ok());
    CHECK(out.pixels[0] == c.offset);
  }
}

TEST_CASE("CenterCrop larger than the image pads with zeros as torchvision", "[transform]") {
  auto ones = [](int x, int, int) { return static_cast<uint8_t>(100 + x); };
  ImageU8 out;
  // Width 3 -> 6: left pad (6 - 3) // 2 = 1, right pad 2. Height 8 -> 6: offset 1.
  REQUIRE(ResizeAndCrop(MakeImage(3, 8, 1, ones), Spec(0, 6), &out).ok());
  REQUIRE(out.width == 6);
  REQUIRE(out.height == 6);
  for (int y = 0; y < 6; ++y) {
    const uint8_t* row = &out.pixels[y * 6];
    CHECK(row[0] == 0);
    CHECK(row[1] == 100);
    CHECK(row[2] == 101);
    CHECK(row[3] == 102);
    CHECK(row[4] == 0);
    CHECK(row[5] == 0);
  }
}

TEST_CASE("resampling reproduces PIL's antialiased bilinear arithmetic", "[transform]") {
  SECTION("4 -> 2 by hand") {
    // Scale 2: support 2. Output 0 (centre 1.0) uses inputs 0..2 with
    // triangle weights .75 .75 .25 (normalised /1.75): (0*3+100*3+200)/7
    // = 71.4 -> 71. Output 1 (centre 3.0) uses 1..3 with .25 .75 .75:
    // (100 + 200*3 + 255*3) / 7 = 209.3 -> 209.
    const uint8_t row[4] = {0, 100, 200, 255};
    ImageU8 in = MakeImage(4, 1, 1, [](int, int, int) { return uint8_t{0}; });
    std::memcpy(in.pixels.data(), row, 4);
    ResizeSpec s;
    s.squash_w = 2;
    s.squash_h = 1;
    ImageU8 out;
    REQUIRE(ResizeAndCrop(in, s, &out).ok());
    REQUIRE(out.pixels.size() == 2);
    CHECK(out.pixels[0] == 71);
    CHECK(out.pixels[1] == 209);
  }
  SECTION("2 -> 4 upscale by hand") {
    // Scale 0.5: support 1. Output 0 (centre 0.25): inputs 0..1, weights
    // tri(0.25)=.75 and tri(1.25)=0 -> 10. Output 1 (centre .75): inputs
    // 0..1, tri(-.25)=.75, tri(.75)=.25 -> 10*.75 + 210*.25 = 60.
    ImageU8 in = MakeImage(2, 1, 1, [](int x, int, int) { return uint8_t(x == 0 ? 10 : 210); });
    ResizeSpec s;
    s.squash_w = 4;
    s.squash_h = 1;
    ImageU8 out;
    REQUIRE(ResizeAndCrop(in, s, &out).ok());
    REQUIRE(out.pixels.size() == 4);
    CHECK(out.pixels[0] == 10);
    CHECK(out.pixels[1] == 60);
    CHECK(out.pixels[2] == 160);
    CHECK(out.pixels[3] == 210);
  }
  SECTION("a flat image stays flat at any scale") {
    ImageU8 in = MakeImage(123, 77, 3, [](int, int, int c) { return uint8_t(37 + 80 * c); });
    for (int s : {10, 50, 76, 77, 100, 300}) {
      ImageU8 out;
      REQUIRE(ResizeAndCrop(in, Spec(s, 0), &out).ok());
      for (size_t i = 0; i < out.pixels.size(); ++i) REQUIRE(out.pixels[i] == 37 + 80 * (i % 3));
    }
  }
  SECTION("same size is the identity") {
    ImageU8 in =
        MakeImage(40, 30, 3, [](int x, int y, int c) { return uint8_t(x * 7 + y * 3 + c); });
    ImageU8 out;
    REQUIRE(ResizeAndCrop(in, Spec(30, 0), &out).ok());
    CHECK(out.pixels == in.pixels);
  }
  SECTION("cropping the resized image equals resizing then cropping") {
    ImageU8 in = MakeImage(
        300, 200, 3, [](int x, int y, int c) { return uint8_t((x * 13 + y * 7 + c * 50) % 256); });
    ImageU8 full, cropped;
    REQUIRE(ResizeAndCrop(in, Spec(100, 0), &full).ok());  // 150x100
    REQUIRE(ResizeAndCrop(in, Spec(100, 64), &cropped).ok());
    REQUIRE(full.width == 150);
    const int left = 43, top = 18;  // round(86 / 2) = 43, round(36 / 2) = 18
    for (int y = 0; y < 64; ++y) {
      for (int x = 0; x < 64 * 3; ++x) {
        REQUIRE(cropped.pixels[y * 64 * 3 + x] == full.pixels[(y + top) * 150 * 3 + left * 3 + x]);
      }
    }
  }
}

TEST_CASE("ToCHW relayouts and normalises like ToTensor + Normalize", "[transform]") {
  // 2x1 RGB: pixel 0 = (0, 128, 255), pixel 1 = (255, 0, 128).
  ImageU8 in;
  in.width = 2;
  in.height = 1;
  in.channels = 3;
  in.pixels = {0, 128, 255, 255, 0, 128};

  uint8_t u8[6];
  REQUIRE(ToCHW(in, DType::kUint8, nullptr, nullptr, u8).ok());
  const uint8_t want_u8[6] = {0, 255, 128, 0, 255, 128};
  CHECK(std::memcmp(u8, want_u8, 6) == 0);

  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  float f32[6];
  REQUIRE(ToCHW(in, DType::kFloat32, mean, std, f32).ok());
  // (0 - .485) / .229 = -2.117904; (1 - .485) / .229 = 2.248908;
  // (128/255 - .456) / .224 = 0.2051822; (0 - .456) / .224 = -2.035714;
  // (1 - .406) / .225 = 2.64; (128/255 - .406) / .225 = 0.4264926.
  const float want_f32[6] = {-2.117904f, 2.248908f, 0.2051822f, -2.035714f, 2.64f, 0.4264926f};
  for (int i = 0; i < 6; ++i) CHECK(f32[i] == Approx(want_f32[i]).epsilon(1e-6));

  uint16_t f16[6];
  REQUIRE(ToCHW(in, DType::kFloat16, nullptr, nullptr, f16).ok());
  // 0 -> 0x0000, 1 -> 0x3C00, 128/255 = 0.50196 = (1 + 4.016/1024) * 2^-1 -> 0x3804.
  const uint16_t want_f16[6] = {0x0000, 0x3C00, 0x3804, 0x0000, 0x3C00, 0x3804};
  for (int i = 0; i < 6; ++i) CHECK(f16[i] == want_f16[i]);

  REQUIRE(ToCHW(in, DType::kFloat16, mean, std, f16).ok());
  CHECK(f16[0] == FloatToHalf(want_f32[0]));
  // -2.117904 = -(1 + 0.058952) * 2 -> mantissa round(60.37) = 60: 0xC000 | 60.
  CHECK(f16[0] == (0xC000 | 60));
  // The rest as torch's float32 -> half gives them (checked with PyTorch).
  const uint16_t want_norm_f16[6] = {0xC03C, 0x407F, 0x3291, 0xC012, 0x4148, 0x36D3};
  for (int i = 0; i < 6; ++i) CHECK(f16[i] == want_norm_f16[i]);

  const float zero_std[3] = {1.0f, 0.0f, 1.0f};
  CHECK(ToCHW(in, DType::kFloat32, mean, zero_std, f32).IsInvalidArgument());
  CHECK(DTypeSize(DType::kFloat16) == 2);
  CHECK(DTypeSize(DType::kFloat32) == 4);
}

TEST_CASE("FloatToHalf rounds to nearest even", "[transform]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(FloatToHalf(0.0f) == 0x0000);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  CHECK(FloatToHalf(1.0f) == 0x3C00);
  CHECK(FloatToHalf(-2.0f) == 0xC000);
  CHECK(FloatToHalf(0.1f) == 0x2E66);
  CHECK(FloatToHalf(65504.0f) == 0x7BFF);  // largest half
  CHECK(FloatToHalf(65519.0f) == 0x7BFF);  // below the halfway point
  CHECK(FloatToHalf(65520.0f) == 0x7C00);  // halfway: rounds (to even) to infinity
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie -> even (down)
  CHECK(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie -> even (up)
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
  CHECK(FloatToHalf(std::ldexp(1.0f, -14)) == 0x0400);      // smallest normal
  CHECK(FloatToHalf(std::ldexp(1.0f, -24)) == 0x0001);      // smallest subnormal
  CHECK(FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);      // tie -> even (zero)
  CHECK(FloatToHalf(3 * std::ldexp(1.0f, -25)) == 0x0002);  // 1.5 ulp -> 2
  CHECK(FloatToHalf(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)) ==
        0x0400);  // rounds up to normal
  CHECK(FloatToHalf(inf) == 0x7C00);
  CHECK(FloatToHalf(-inf) == 0xFC00);
  CHECK(FloatToHalf(1e10f) == 0x7C00);
  CHECK(FloatToHalf(std::nanf("")) == 0x7E00);
}

}  // namespace
}  // namespace kiln::image
