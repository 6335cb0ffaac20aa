// The SIMD resampling kernels (chosen at run time on x86-64) against the
// portable ones: the same bytes for every channel count, scale and region.
#include "pixels/resample.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace kiln::pixels {
namespace {

std::vector<uint8_t> Run(const std::vector<uint8_t>& in, int in_w, int in_h, int c, double box_w,
                         double box_h, int out_w, int out_h, int x0, int y0, int rw, int rh,
                         KernelLevel level) {
  UseKernelsUpTo(level);
  // One guard byte after each output row: nothing may be written there.
  const size_t stride = static_cast<size_t>(rw) * c + 1;
  std::vector<uint8_t> out(stride * rh, 0xA5);
  ResampleRegion(in.data(), in_w, in_h, c, box_w, box_h, out_w, out_h, x0, y0, rw, rh, out.data(),
                 stride);
  UseKernelsUpTo(kKernelsAvx512);
  return out;
}

// Every kernel level against the portable one, with the guard bytes intact.
void CompareLevels(const std::vector<uint8_t>& in, int in_w, int in_h, int c, double box_w,
                   double box_h, int out_w, int out_h, int x0, int y0, int rw, int rh) {
  const auto portable = Run(in, in_w, in_h, c, box_w, box_h, out_w, out_h, x0, y0, rw, rh, kKernelsPortable);
  for (KernelLevel level : {kKernelsSse41, kKernelsAvx2, kKernelsAvx512}) {
    const auto fast = Run(in, in_w, in_h, c, box_w, box_h, out_w, out_h, x0, y0, rw, rh, level);
    INFO("kernel level " << level << ": " << in_w << "x" << in_h << "x" << c << " box " << box_w
                         << "x" << box_h << " -> " << out_w << "x" << out_h << " region " << rw
                         << "x" << rh << " at " << x0 << "," << y0);
    REQUIRE(fast == portable);
    for (int y = 0; y < rh; ++y) REQUIRE(fast[(y + 1) * (static_cast<size_t>(rw) * c + 1) - 1] == 0xA5);
  }
}

TEST_CASE("SIMD and portable resampling give the same bytes", "[transform][resample]") {
  std::mt19937 rng(7);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int c = uni(1, 4);
    const int in_w = uni(1, 400), in_h = uni(1, 300);
    // Mostly downscaling (the build's case), some upscaling and identity.
    const int out_w = uni(1, in_w * 3 / 2 + 1), out_h = uni(1, in_h * 3 / 2 + 1);
    const double box_w = trial % 3 == 0 ? in_w - uni(0, in_w - 1) * 0.25 : in_w;
    const double box_h = trial % 3 == 0 ? in_h - uni(0, in_h - 1) * 0.25 : in_h;
    // Every fourth trial takes the whole image, so that windows reach the
    // last pixel of the last row (where a careless vector load overreads).
    const bool whole = trial % 4 == 1;
    const int rw = whole ? out_w : uni(1, out_w), rh = whole ? out_h : uni(1, out_h);
    const int x0 = uni(0, out_w - rw), y0 = uni(0, out_h - rh);
    std::vector<uint8_t> in(static_cast<size_t>(in_w) * in_h * c);
    // Extremes as well as noise, so that saturation is exercised.
    for (auto& v : in) v = trial % 5 == 0 ? (uni(0, 1) ? 255 : 0) : static_cast<uint8_t>(uni(0, 255));
    INFO("trial " << trial);
    CompareLevels(in, in_w, in_h, c, box_w, box_h, out_w, out_h, x0, y0, rw, rh);
    ++compared;
  }
  CHECK(compared == 300);
}

TEST_CASE("SIMD resampling at the build's scales (windows of 2 to 7 taps) gives the portable bytes",
          "[transform][resample]") {
  // Shorter sides of 256-700 resized to 256 and center-cropped, as kiln build
  // does with --resize 256 --crop 224: downscales of 1 to 2.7, 3 and 4 channels.
  std::mt19937 rng(11);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 120; ++trial) {
    const int c = uni(3, 4);
    const int in_w = uni(256, 700), in_h = uni(100, 160);
    const int out_w = 256, out_h = uni(60, in_h);
    const int rw = uni(1, 224), rh = uni(1, out_h);
    const int x0 = uni(0, out_w - rw), y0 = uni(0, out_h - rh);
    std::vector<uint8_t> in(static_cast<size_t>(in_w) * in_h * c);
    for (auto& v : in) v = trial % 7 == 0 ? (uni(0, 1) ? 255 : 0) : static_cast<uint8_t>(uni(0, 255));
    INFO("trial " << trial);
    CompareLevels(in, in_w, in_h, c, in_w, in_h, out_w, out_h, x0, y0, rw, rh);
  }
}

TEST_CASE(
    "ResamplePlanes gives each plane ResampleRegion's bytes, mirrored when flipped, at every "
    "kernel level",
    "[transform][resample]") {
  // The loader's case: a box of a larger planar image (rows of the whole
  // image's width), mostly upscaled to the output as RandomResizedCrop
  // does, some downscales, written into a window of a wider output.
  std::mt19937 rng(13);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 200; ++trial) {
    const int planes = uni(1, 4);
    const int img_w = uni(1, 300), img_h = uni(1, 260);
    const int bw = uni(1, img_w), bh = uni(1, img_h);
    const int bx = uni(0, img_w - bw), by = uni(0, img_h - bh);
    const int out_w = trial % 5 == 0 ? bw : uni(1, trial % 3 == 0 ? bw : 3 * bw + 8);
    const int out_h = trial % 7 == 0 ? bh : uni(1, trial % 3 == 0 ? bh : 3 * bh + 8);
    const int rw = uni(1, out_w), rh = uni(1, out_h);
    const int x0 = uni(0, out_w - rw), y0 = uni(0, out_h - rh);
    const bool flip = trial % 2 == 1;
    std::vector<uint8_t> img(static_cast<size_t>(planes) * img_w * img_h);
    for (auto& v : img)
      v = trial % 5 == 1 ? (uni(0, 1) ? 255 : 0) : static_cast<uint8_t>(uni(0, 255));
    // The expected bytes: each plane's box copied out and resampled alone.
    const size_t dst_stride = static_cast<size_t>(rw) + 3, dst_plane = dst_stride * rh + 5;
    std::vector<uint8_t> expected(dst_plane * planes, 0x5A);
    for (int p = 0; p < planes; ++p) {
      std::vector<uint8_t> box(static_cast<size_t>(bw) * bh);
      for (int y = 0; y < bh; ++y)
        for (int x = 0; x < bw; ++x)
          box[static_cast<size_t>(y) * bw + x] =
              img[(static_cast<size_t>(p) * img_h + by + y) * img_w + bx + x];
      std::vector<uint8_t> region(static_cast<size_t>(rw) * rh);
      UseKernelsUpTo(kKernelsPortable);
      ResampleRegion(box.data(), bw, bh, 1, bw, bh, out_w, out_h, x0, y0, rw, rh, region.data(),
                     rw);
      UseKernelsUpTo(kKernelsAvx512);
      for (int y = 0; y < rh; ++y)
        for (int x = 0; x < rw; ++x)
          expected[p * dst_plane + y * dst_stride + x] =
              region[static_cast<size_t>(y) * rw + (flip ? rw - 1 - x : x)];
    }
    for (KernelLevel level : {kKernelsPortable, kKernelsSse41, kKernelsAvx2, kKernelsAvx512}) {
      std::vector<uint8_t> got(dst_plane * planes, 0x5A);
      UseKernelsUpTo(level);
      ResamplePlanes(img.data() + static_cast<size_t>(by) * img_w + bx, img_w,
                     static_cast<size_t>(img_w) * img_h, planes, bw, bh, bw, bh, out_w, out_h, x0,
                     y0, rw, rh, flip, got.data(), dst_stride, dst_plane);
      UseKernelsUpTo(kKernelsAvx512);
      INFO("trial " << trial << ", level " << level << ": " << planes << " planes, box " << bw
                    << "x" << bh << " of " << img_w << "x" << img_h << " -> " << out_w << "x"
                    << out_h << " region " << rw << "x" << rh << " at " << x0 << "," << y0
                    << (flip ? " flipped" : ""));
      REQUIRE(got == expected);
    }
  }
}

}  // namespace
}  // namespace kiln::pixels

namespace kiln::pixels {
namespace {

TEST_CASE("a two-axis resize takes Pillow 13's pass order: vertical first when the height shrinks "
          "by more than twice the width",
          "[transform][resample]") {
  CHECK(PillowVerticalFirst(30, 35, 32, 32));     // x grows, y shrinks by 3
  CHECK_FALSE(PillowVerticalFirst(80, 68, 69, 55));  // 13 > 2 * 11 fails: horizontal first
  CHECK(PillowVerticalFirst(50, 58, 49, 5));
  CHECK_FALSE(PillowVerticalFirst(40, 30, 20, 40));  // y grows
  // The result is the two one-axis resizes in that order, for every kernel
  // level, whole outputs and regions of them (the loader's centre crops).
  std::mt19937 rng(11);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int vertical_first = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int c = uni(1, 4);
    const int in_w = uni(2, 120), in_h = uni(2, 160);
    const int out_w = uni(1, in_w * 3 / 2 + 1), out_h = uni(1, in_h);
    if (out_w == in_w || out_h == in_h) continue;
    std::vector<uint8_t> in(static_cast<size_t>(in_w) * in_h * c);
    for (auto& v : in) v = static_cast<uint8_t>(uni(0, 255));
    const bool vfirst = PillowVerticalFirst(in_w, in_h, out_w, out_h);
    vertical_first += vfirst;
    // The oracle: one axis, then the other.
    const int mid_w = vfirst ? in_w : out_w, mid_h = vfirst ? out_h : in_h;
    const auto mid = Run(in, in_w, in_h, c, in_w, in_h, mid_w, mid_h, 0, 0, mid_w, mid_h,
                         kKernelsPortable);
    std::vector<uint8_t> packed;  // Run's rows carry a guard byte
    for (int y = 0; y < mid_h; ++y)
      packed.insert(packed.end(), mid.begin() + y * (static_cast<size_t>(mid_w) * c + 1),
                    mid.begin() + y * (static_cast<size_t>(mid_w) * c + 1) + mid_w * c);
    const auto want = Run(packed, mid_w, mid_h, c, mid_w, mid_h, out_w, out_h, 0, 0, out_w,
                          out_h, kKernelsPortable);
    const int rw = uni(1, out_w), rh = uni(1, out_h);
    const int x0 = uni(0, out_w - rw), y0 = uni(0, out_h - rh);
    for (KernelLevel level : {kKernelsPortable, kKernelsSse41, kKernelsAvx2, kKernelsAvx512}) {
      INFO("trial " << trial << " level " << level << ": " << in_w << "x" << in_h << "x" << c
                    << " -> " << out_w << "x" << out_h << (vfirst ? " vertical first" : ""));
      REQUIRE(Run(in, in_w, in_h, c, in_w, in_h, out_w, out_h, 0, 0, out_w, out_h, level) == want);
      const auto part = Run(in, in_w, in_h, c, in_w, in_h, out_w, out_h, x0, y0, rw, rh, level);
      for (int y = 0; y < rh; ++y)
        for (int x = 0; x < rw * c; ++x)
          REQUIRE(part[y * (static_cast<size_t>(rw) * c + 1) + x] ==
                  want[(y0 + y) * (static_cast<size_t>(out_w) * c + 1) + x0 * c + x]);
    }
  }
  CHECK(vertical_first > 40);
}

}  // namespace
}  // namespace kiln::pixels
