// Tests for kiln::image::Decode / ReadHeader: every supported format and
// layout decodes to the requested channels and the right pixels, and
// damaged inputs are rejected with a message naming the file.
#include "kiln/image/decode.h"

#include <turbojpeg.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <random>
#include <string>
#include <vector>

#include "kiln/image/transform.h"
#include "test_util.h"

namespace kiln::image {
namespace {

using Bytes = std::vector<uint8_t>;

// A smooth RGB test picture (compresses well, so JPEG error stays small).
Bytes Gradient(int w, int h) {
  Bytes rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / (w - 1));
      p[1] = static_cast<uint8_t>(y * 255 / (h - 1));
      p[2] = static_cast<uint8_t>(128 + 60 * std::sin(x * 0.05) * std::cos(y * 0.07));
    }
  }
  return rgb;
}

Bytes CompressJpeg(const uint8_t* pixels, int w, int h, int pixel_format, int subsamp, int flags,
                   int quality = 95) {
  tjhandle handle = tjInitCompress();
  REQUIRE(handle != nullptr);
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc =
      tjCompress2(handle, pixels, w, 0, h, pixel_format, &jpeg, &size, subsamp, quality, flags);
  INFO(tjGetErrorStr2(handle));
  REQUIRE(rc == 0);
  Bytes out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(handle);
  return out;
}

Bytes EncodeCv(const cv::Mat& mat, const std::string& ext, const std::vector<int>& params = {}) {
  std::vector<uint8_t> out;
  REQUIRE(cv::imencode(ext, mat, out, params));
  return out;
}

// Converts packed RGB to an OpenCV BGR matrix.
cv::Mat ToBgr(const Bytes& rgb, int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int i = 0; i < w * h; ++i) {
    m.data[i * 3 + 0] = rgb[i * 3 + 2];
    m.data[i * 3 + 1] = rgb[i * 3 + 1];
    m.data[i * 3 + 2] = rgb[i * 3 + 0];
  }
  return m;
}

// Writes `bytes` to a file in `dir` and decodes it back from the file.
Status DecodeFile(const testing::TempDir& dir, const std::string& name, const Bytes& bytes,
                  const DecodeOptions& options, ImageU8* out, std::string* path = nullptr) {
  const std::string p = dir / name;
  testing::WriteFile(p, std::string(bytes.begin(), bytes.end()));
  if (path != nullptr) *path = p;
  const std::string data = testing::ReadFile(p);
  return Decode(reinterpret_cast<const uint8_t*>(data.data()), data.size(), p, options, out);
}

double MeanAbsDiff(const Bytes& a, const Bytes& b) {
  REQUIRE(a.size() == b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(int(a[i]) - int(b[i]));
  return sum / a.size();
}

int MaxAbsDiff(const Bytes& a, const Bytes& b) {
  REQUIRE(a.size() == b.size());
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

DecodeOptions Channels(int c) {
  DecodeOptions o;
  o.channels = c;
  return o;
}

// PIL's RGB -> L.
uint8_t Luma(int r, int g, int b) { return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16; }

TEST_CASE("baseline and progressive JPEG decode to RGB", "[decode]") {
  testing::TempDir dir;
  const int w = 64, h = 48;
  const Bytes rgb = Gradient(w, h);
  for (int flags : {0, TJFLAG_PROGRESSIVE}) {
    for (int subsamp : {TJSAMP_444, TJSAMP_420}) {
      const Bytes jpeg = CompressJpeg(rgb.data(), w, h, TJPF_RGB, subsamp, flags);
      ImageU8 img;
      REQUIRE(DecodeFile(dir, "a.jpg", jpeg, Channels(3), &img).ok());
      CHECK(img.width == w);
      CHECK(img.height == h);
      CHECK(img.channels == 3);
      CHECK(img.source_width == w);
      CHECK(img.scale_denom == 1);
      CHECK(MeanAbsDiff(img.pixels, rgb) < 2.0);
    }
  }
}

TEST_CASE("colour JPEG to one channel equals PIL's convert('L') of the RGB decode", "[decode]") {
  testing::TempDir dir;
  const Bytes jpeg = CompressJpeg(Gradient(40, 30).data(), 40, 30, TJPF_RGB, TJSAMP_420, 0);
  ImageU8 rgb, gray;
  REQUIRE(DecodeFile(dir, "a.jpg", jpeg, Channels(3), &rgb).ok());
  REQUIRE(DecodeFile(dir, "a.jpg", jpeg, Channels(1), &gray).ok());
  REQUIRE(gray.channels == 1);
  for (int i = 0; i < 40 * 30; ++i) {
    REQUIRE(gray.pixels[i] ==
            Luma(rgb.pixels[i * 3], rgb.pixels[i * 3 + 1], rgb.pixels[i * 3 + 2]));
  }
}

TEST_CASE("CMYK JPEG converts to RGB as PIL does (Adobe inverted polarity)", "[decode]") {
  testing::TempDir dir;
  const int w = 32, h = 16;
  // Left half one colour, right half another (stored, Adobe-inverted values).
  const uint8_t left[4] = {200, 100, 50, 180}, right[4] = {30, 240, 128, 255};
  Bytes cmyk(w * h * 4);
  for (int i = 0; i < w * h; ++i) {
    const uint8_t* c = (i % w) < w / 2 ? left : right;
    for (int k = 0; k < 4; ++k) cmyk[i * 4 + k] = c[k];
  }
  const Bytes jpeg = CompressJpeg(cmyk.data(), w, h, TJPF_CMYK, TJSAMP_444, 0, 100);
  ImageU8 img;
  REQUIRE(DecodeFile(dir, "cmyk.jpg", jpeg, Channels(3), &img).ok());
  REQUIRE(img.channels == 3);
  // PIL: R = K - round((255 - C) * K / 255), by hand:
  // left: K=180: R = 180 - round(55*180/255=38.8)=141, G = 180 - round(155*180/255=109.4)=71,
  //       B = 180 - round(205*180/255=144.7) = 35.
  // right: K=255: R = 30, G = 240, B = 128.
  const int expect_left[3] = {141, 71, 35}, expect_right[3] = {30, 240, 128};
  const uint8_t* pl = &img.pixels[(8 * w + 4) * 3];
  const uint8_t* pr = &img.pixels[(8 * w + 28) * 3];
  for (int c = 0; c < 3; ++c) {
    CHECK(std::abs(pl[c] - expect_left[c]) <= 2);
    CHECK(std::abs(pr[c] - expect_right[c]) <= 2);
  }
  ImageU8 gray;
  REQUIRE(DecodeFile(dir, "cmyk.jpg", jpeg, Channels(1), &gray).ok());
  CHECK(std::abs(gray.pixels[8 * w + 4] - Luma(pl[0], pl[1], pl[2])) <= 0);
}

TEST_CASE("grayscale JPEG decodes to 1 channel or replicated RGB", "[decode]") {
  testing::TempDir dir;
  const int w = 40, h = 24;
  Bytes gray(w * h);
  for (int i = 0; i < w * h; ++i) gray[i] = static_cast<uint8_t>((i % w) * 6);
  const Bytes jpeg = CompressJpeg(gray.data(), w, h, TJPF_GRAY, TJSAMP_GRAY, 0, 100);
  ImageU8 one, three;
  REQUIRE(DecodeFile(dir, "g.jpg", jpeg, Channels(1), &one).ok());
  REQUIRE(DecodeFile(dir, "g.jpg", jpeg, Channels(3), &three).ok());
  CHECK(one.channels == 1);
  CHECK(MaxAbsDiff(one.pixels, gray) <= 2);
  REQUIRE(three.channels == 3);
  for (int i = 0; i < w * h; ++i) {
    REQUIRE(three.pixels[i * 3] == one.pixels[i]);
    REQUIRE(three.pixels[i * 3 + 1] == one.pixels[i]);
    REQUIRE(three.pixels[i * 3 + 2] == one.pixels[i]);
  }
}

TEST_CASE("lossless formats decode exactly, in RGB order", "[decode]") {
  testing::TempDir dir;
  const int w = 33, h = 21;
  const Bytes rgb = Gradient(w, h);
  const cv::Mat bgr = ToBgr(rgb, w, h);
  const std::vector<std::pair<std::string, std::vector<int>>> formats = {
      {".png", {}}, {".bmp", {}}, {".tiff", {}}, {".webp", {cv::IMWRITE_WEBP_QUALITY, 101}}};
  for (const auto& [ext, params] : formats) {
    INFO(ext);
    ImageU8 img;
    REQUIRE(DecodeFile(dir, "img" + ext, EncodeCv(bgr, ext, params), Channels(3), &img).ok());
    CHECK(img.width == w);
    CHECK(img.height == h);
    CHECK(img.pixels == rgb);
    ImageU8 gray;
    REQUIRE(DecodeFile(dir, "img" + ext, EncodeCv(bgr, ext, params), Channels(1), &gray).ok());
    CHECK(gray.pixels[5] == Luma(rgb[15], rgb[16], rgb[17]));
  }
  // Lossy WebP: close, not exact.
  ImageU8 lossy;
  REQUIRE(DecodeFile(dir, "lossy.webp", EncodeCv(bgr, ".webp", {cv::IMWRITE_WEBP_QUALITY, 95}),
                     Channels(3), &lossy)
              .ok());
  CHECK(MeanAbsDiff(lossy.pixels, rgb) < 4.0);
}

TEST_CASE("grayscale PNG decodes to 1 channel or replicated RGB", "[decode]") {
  testing::TempDir dir;
  cv::Mat gray(10, 12, CV_8UC1);
  for (int i = 0; i < 120; ++i) gray.data[i] = static_cast<uint8_t>(i * 2);
  ImageU8 one, three;
  REQUIRE(DecodeFile(dir, "g.png", EncodeCv(gray, ".png"), Channels(1), &one).ok());
  REQUIRE(DecodeFile(dir, "g.png", EncodeCv(gray, ".png"), Channels(3), &three).ok());
  REQUIRE(one.pixels.size() == 120);
  REQUIRE(three.pixels.size() == 360);
  for (int i = 0; i < 120; ++i) {
    REQUIRE(one.pixels[i] == i * 2);
    REQUIRE(three.pixels[i * 3 + 1] == i * 2);
  }
}

TEST_CASE("16-bit PNG keeps the high byte, as PIL does", "[decode]") {
  testing::TempDir dir;
  cv::Mat m(1, 4, CV_16UC3);
  const uint16_t values[4][3] = {{0, 255, 256}, {65535, 32896, 51528}, {383, 384, 1000}, {7, 8, 9}};
  for (int x = 0; x < 4; ++x) {
    for (int c = 0; c < 3; ++c) m.at<cv::Vec3w>(0, x)[c] = values[x][2 - c];  // BGR
  }
  ImageU8 img;
  REQUIRE(DecodeFile(dir, "deep.png", EncodeCv(m, ".png"), Channels(3), &img).ok());
  REQUIRE(img.pixels.size() == 12);
  for (int x = 0; x < 4; ++x) {
    for (int c = 0; c < 3; ++c) CHECK(img.pixels[x * 3 + c] == (values[x][c] >> 8));
  }
}

TEST_CASE("alpha is dropped without compositing", "[decode]") {
  testing::TempDir dir;
  cv::Mat bgra(2, 3, CV_8UC4);
  for (int i = 0; i < 6; ++i) {
    bgra.data[i * 4 + 0] = static_cast<uint8_t>(10 * i);  // B
    bgra.data[i * 4 + 1] = static_cast<uint8_t>(20 * i);  // G
    bgra.data[i * 4 + 2] = static_cast<uint8_t>(40 * i);  // R
    bgra.data[i * 4 + 3] = static_cast<uint8_t>(i * 50);  // alpha, 0 = transparent
  }
  ImageU8 img;
  REQUIRE(DecodeFile(dir, "a.png", EncodeCv(bgra, ".png"), Channels(3), &img).ok());
  REQUIRE(img.channels == 3);
  for (int i = 0; i < 6; ++i) {
    CHECK(img.pixels[i * 3 + 0] == 40 * i);
    CHECK(img.pixels[i * 3 + 1] == 20 * i);
    CHECK(img.pixels[i * 3 + 2] == 10 * i);
  }
}

TEST_CASE("palette PNG with transparency decodes to its palette colours", "[decode]") {
  if (access(KILN_PYTHON3, X_OK) != 0) {
    testing::Skip(testing::SkipWhy::kNotBuilt, "no python3 at " KILN_PYTHON3);
    return;
  }
  testing::TempDir dir;
  const std::string path = dir / "palette.png";
  // Index i has colour (10i, 255 - 10i, 5i) and alpha 20i; pixel x has index x % 8.
  const std::string script =
      "from PIL import Image\n"
      "im = Image.new('P', (16, 4))\n"
      "im.putpalette(sum([[10*i, 255-10*i, 5*i] for i in range(8)], []))\n"
      "im.putdata([x % 8 for y in range(4) for x in range(16)])\n"
      "im.info['transparency'] = bytes([20*i for i in range(8)])\n"
      "im.save('" +
      path + "', transparency=bytes([20*i for i in range(8)]))\n";
  testing::WriteFile(dir / "make.py", script);
  std::string output;
  const int rc = testing::RunCommand(std::string(KILN_PYTHON3) + " " + (dir / "make.py"), &output);
  if (rc != 0 && output.find("No module named") != std::string::npos) {
    testing::Skip(testing::SkipWhy::kNotBuilt, "PIL missing: " + output);
    return;
  }
  REQUIRE(rc == 0);
  const std::string data = testing::ReadFile(path);
  for (int channels : {3, 1}) {
    ImageU8 img;
    REQUIRE(Decode(reinterpret_cast<const uint8_t*>(data.data()), data.size(), path,
                   Channels(channels), &img)
                .ok());
    REQUIRE(img.width == 16);
    REQUIRE(img.channels == channels);
    for (int x = 0; x < 16; ++x) {
      const int i = x % 8, r = 10 * i, g = 255 - 10 * i, b = 5 * i;
      if (channels == 3) {
        CHECK(img.pixels[x * 3 + 0] == r);
        CHECK(img.pixels[x * 3 + 1] == g);
        CHECK(img.pixels[x * 3 + 2] == b);
      } else {
        CHECK(img.pixels[x] == Luma(r, g, b));
      }
    }
  }
}

TEST_CASE("damaged inputs are rejected naming the file", "[decode]") {
  testing::TempDir dir;
  const Bytes jpeg = CompressJpeg(Gradient(64, 64).data(), 64, 64, TJPF_RGB, TJSAMP_420, 0);
  ImageU8 img;
  std::string path;

  SECTION("truncated JPEG") {
    const Bytes cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
    const Status s = DecodeFile(dir, "cut.jpg", cut, Channels(3), &img, &path);
    CHECK(s.IsCorruption());
    CHECK(s.message().find(path) != std::string::npos);
  }
  SECTION("truncated progressive JPEG") {
    const Bytes prog =
        CompressJpeg(Gradient(64, 64).data(), 64, 64, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE);
    const Bytes cut(prog.begin(), prog.begin() + prog.size() * 2 / 3);
    const Status s = DecodeFile(dir, "cutp.jpg", cut, Channels(3), &img, &path);
    CHECK(s.IsCorruption());
    CHECK(s.message().find(path) != std::string::npos);
  }
  SECTION("truncated PNG") {
    const Bytes png = EncodeCv(ToBgr(Gradient(64, 64), 64, 64), ".png");
    const Bytes cut(png.begin(), png.begin() + png.size() / 2);
    const Status s = DecodeFile(dir, "cut.png", cut, Channels(3), &img, &path);
    CHECK(s.IsCorruption());
    CHECK(s.message().find(path) != std::string::npos);
  }
  SECTION("empty file") {
    const Status s = DecodeFile(dir, "empty.jpg", {}, Channels(3), &img, &path);
    CHECK(s.IsCorruption());
    CHECK(s.message().find(path) != std::string::npos);
    CHECK(s.message().find("empty") != std::string::npos);
  }
  SECTION("random bytes") {
    std::mt19937 rng(42);
    Bytes noise(4096);
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    const Status s = DecodeFile(dir, "noise.jpg", noise, Channels(3), &img, &path);
    CHECK(s.IsCorruption());
    CHECK(s.message().find(path) != std::string::npos);
  }
  SECTION("JPEG signature followed by garbage") {
    Bytes bad = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0, 1, 2, 3, 4, 5};
    const Status s = DecodeFile(dir, "bad.jpg", bad, Channels(3), &img, &path);
    CHECK(s.IsCorruption());
    CHECK(s.message().find(path) != std::string::npos);
  }
  SECTION("PNG header claiming huge dimensions") {
    Bytes png = EncodeCv(ToBgr(Gradient(8, 8), 8, 8), ".png");
    // IHDR width and height (big-endian) at bytes 16 and 20: 200000 x 100000.
    const uint8_t big_w[4] = {0x00, 0x03, 0x0D, 0x40}, big_h[4] = {0x00, 0x01, 0x86, 0xA0};
    std::copy(big_w, big_w + 4, png.begin() + 16);
    std::copy(big_h, big_h + 4, png.begin() + 20);
    const Status s = DecodeFile(dir, "bomb.png", png, Channels(3), &img, &path);
    CHECK(s.IsInvalidArgument());
    CHECK(s.message().find(path) != std::string::npos);
    CHECK(s.message().find("200000x100000") != std::string::npos);
  }
  SECTION("max_pixels set low") {
    DecodeOptions o;
    o.max_pixels = 64 * 63;
    const Status s = DecodeFile(dir, "big.jpg", jpeg, o, &img, &path);
    CHECK(s.IsInvalidArgument());
    CHECK(s.message().find(path) != std::string::npos);
    CHECK(s.message().find("max_pixels") != std::string::npos);
  }
  SECTION("bad channel count") {
    CHECK(DecodeFile(dir, "a.jpg", jpeg, Channels(2), &img).IsInvalidArgument());
  }
}

TEST_CASE("ReadHeader reads sizes without decoding", "[decode]") {
  const int w = 37, h = 19;
  const Bytes rgb = Gradient(w, h);
  const cv::Mat bgr = ToBgr(rgb, w, h);
  std::vector<Bytes> files = {CompressJpeg(rgb.data(), w, h, TJPF_RGB, TJSAMP_420, 0),
                              EncodeCv(bgr, ".png"),
                              EncodeCv(bgr, ".bmp"),
                              EncodeCv(bgr, ".tiff"),
                              EncodeCv(bgr, ".webp", {cv::IMWRITE_WEBP_QUALITY, 101}),
                              EncodeCv(bgr, ".webp", {cv::IMWRITE_WEBP_QUALITY, 80})};
  for (size_t i = 0; i < files.size(); ++i) {
    INFO("file " << i);
    int rw = 0, rh = 0;
    REQUIRE(ReadHeader(files[i].data(), files[i].size(), "x", &rw, &rh).ok());
    CHECK(rw == w);
    CHECK(rh == h);
  }
  int rw, rh;
  const uint8_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(ReadHeader(junk, 8, "junk.bin", &rw, &rh).IsNotSupported());
  CHECK(ReadHeader(junk, 0, "none.bin", &rw, &rh).IsCorruption());
}

TEST_CASE("large JPEGs use DCT-domain downscaling, never below the needed size", "[decode]") {
  testing::TempDir dir;
  const int w = 1601, h = 1100;
  const Bytes rgb = Gradient(w, h);
  const Bytes jpeg = CompressJpeg(rgb.data(), w, h, TJPF_RGB, TJSAMP_420, 0);
  ResizeSpec spec;
  spec.resize_shorter = 256;
  spec.crop = 224;
  DecodeOptions options;
  REQUIRE(PlanResize(w, h, spec, &options.min_width, &options.min_height).ok());
  CHECK(options.min_width == 372);
  CHECK(options.min_height == 256);
  ImageU8 scaled, full;
  REQUIRE(DecodeFile(dir, "big.jpg", jpeg, options, &scaled).ok());
  REQUIRE(DecodeFile(dir, "big.jpg", jpeg, DecodeOptions(), &full).ok());
  CHECK(full.width == w);
  CHECK(scaled.source_width == w);
  CHECK(scaled.source_height == h);
  // The decoded image must stay >= 2 x 372x256 = 744x512: 1/4 (401x275) is
  // too small, 1/2 (ceil: 801x550) fits.
  CHECK(scaled.scale_num == 1);
  CHECK(scaled.scale_denom == 2);
  CHECK(scaled.width == 801);
  CHECK(scaled.height == 550);
  ImageU8 a, b;
  REQUIRE(ResizeAndCrop(scaled, spec, &a).ok());
  REQUIRE(ResizeAndCrop(full, spec, &b).ok());
  CHECK(a.width == 224);
  CHECK(a.height == 224);
  CHECK(MeanAbsDiff(a.pixels, b.pixels) < 1.0);

  // 1/2 would give 801x550, under twice 700x500: no downscaling.
  options.min_width = 700;
  options.min_height = 500;
  REQUIRE(DecodeFile(dir, "big.jpg", jpeg, options, &scaled).ok());
  CHECK(scaled.scale_denom == 1);
  CHECK(scaled.width == w);
}

}  // namespace
}  // namespace kiln::image
