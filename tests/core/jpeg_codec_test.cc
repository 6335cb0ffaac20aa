// JPEG record fields: the codec (core/jpeg_codec.h) - a region decode is the
// same pixels as a full decode, at every DCT scale; damaged data is a
// Corruption, never a crash - the record entry of an encoded field, and the
// loader's box decode (core/encoded_image.h) against a full decode.
// (Against Pillow's decode: tests/python/test_jpeg_records.py.)
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/encoded_image.h"
#include "core/jpeg_codec.h"
#include "core/sample_transform.h"
#include "kiln/cache_reader.h"
#include "kiln/record.h"

using namespace kiln;
using namespace kiln::internal;

namespace {

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

const char* const kPhotos[] = {"astronaut", "camera", "chelsea", "coffee", "rocket"};

std::string PhotoPath(const char* name) {
  return std::string(KILN_SAMPLE_DATA) + "/photos/" + name + ".jpg";
}

// A smooth synthetic image (w x h x c), which JPEG keeps well.
std::vector<uint8_t> Gradient(int w, int h, int c) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        px[(static_cast<size_t>(y) * w + x) * c + k] =
            static_cast<uint8_t>(x * 100 / std::max(1, w - 1) + y * (k + 1) * 30 / std::max(1, h - 1) +
                                 k * 40);
  return px;
}

// Pixel (x, y) of a decoded region (interleaved).
const uint8_t* At(const JpegRegion& r, int x, int y) {
  return r.pixels.data() + ((static_cast<size_t>(y - r.y0) * r.width) + (x - r.x0)) * r.channels;
}

}  // namespace

TEST_CASE("a region of a JPEG decodes to the same pixels as the full decode", "[jpeg]") {
  std::mt19937 rng(7);
  Decoder d;
  for (const char* name : kPhotos) {
    const std::vector<uint8_t> bytes = ReadFile(PhotoPath(name));
    REQUIRE(!bytes.empty());
    JpegInfo info;
    REQUIRE(ReadJpegInfo(bytes.data(), bytes.size(), &info).ok());
    const int c = info.components == 1 ? 1 : 3;
    for (int scale : {1, 2, 4, 8}) {
      JpegRegion full, part;
      REQUIRE(d.Decode(bytes.data(), bytes.size(), info.width, info.height, c, scale, 0, 0, 0, 0,
                       &full)
                  .ok());
      REQUIRE(full.width == JpegScaledSize(info.width, scale));
      REQUIRE(full.height == JpegScaledSize(info.height, scale));
      for (int k = 0; k < 12; ++k) {
        const int w = 1 + static_cast<int>(rng() % full.width);
        const int h = 1 + static_cast<int>(rng() % full.height);
        // Boxes at the edges and on iMCU boundaries too.
        int left = static_cast<int>(rng() % (full.width - w + 1));
        int top = static_cast<int>(rng() % (full.height - h + 1));
        if (k == 0) left = top = 0;
        if (k == 1) left = (full.width - w) / 16 * 16, top = (full.height - h) / 16 * 16;
        if (k == 2) left = full.width - w, top = full.height - h;
        REQUIRE(d.Decode(bytes.data(), bytes.size(), info.width, info.height, c, scale, left, top,
                         w, h, &part)
                    .ok());
        INFO(name << " scale 1/" << scale << " box " << left << "," << top << " " << w << "x"
                  << h << ", region " << part.x0 << "," << part.y0 << " " << part.width << "x"
                  << part.height);
        REQUIRE(part.x0 <= left);
        REQUIRE(part.y0 <= top);
        REQUIRE(part.x0 + part.width >= left + w);
        REQUIRE(part.y0 + part.height >= top + h);
        bool same = true;
        for (int y = top; y < top + h && same; ++y)
          for (int x = left; x < left + w && same; ++x)
            for (int ch = 0; ch < c; ++ch) same = same && At(part, x, y)[ch] == At(full, x, y)[ch];
        REQUIRE(same);
      }
    }
  }
}

TEST_CASE("EncodeJpeg writes a JPEG that decodes to the image within JPEG's loss", "[jpeg]") {
  for (int c : {1, 3}) {
    const int w = 77, h = 45;
    const std::vector<uint8_t> px = Gradient(w, h, c);
    std::vector<uint8_t> jpeg;
    REQUIRE(EncodeJpeg(px.data(), w, h, c, 90, &jpeg).ok());
    JpegInfo info;
    REQUIRE(ReadJpegInfo(jpeg.data(), jpeg.size(), &info).ok());
    REQUIRE(info.width == w);
    REQUIRE(info.height == h);
    REQUIRE(info.components == c);
    Decoder d;
    JpegRegion out;
    REQUIRE(d.Decode(jpeg.data(), jpeg.size(), w, h, c, 1, 0, 0, 0, 0, &out).ok());
    double se = 0;
    for (size_t i = 0; i < px.size(); ++i) se += std::pow(double(px[i]) - out.pixels[i], 2);
    const double psnr = 10 * std::log10(255.0 * 255.0 / (se / px.size()));
    INFO("channels " << c << ": PSNR " << psnr);
    REQUIRE(psnr > 30);
    // The same pixels encode to the same bytes (a build is deterministic).
    std::vector<uint8_t> again;
    REQUIRE(EncodeJpeg(px.data(), w, h, c, 90, &again).ok());
    REQUIRE(again == jpeg);
  }
  std::vector<uint8_t> out;
  const std::vector<uint8_t> px = Gradient(4, 4, 3);
  REQUIRE(EncodeJpeg(px.data(), 4, 4, 3, 0, &out).IsInvalidArgument());
  REQUIRE(EncodeJpeg(px.data(), 4, 4, 2, 90, &out).IsInvalidArgument());
}

TEST_CASE("a damaged or mismatched JPEG is a Corruption, never a crash", "[jpeg]") {
  const std::vector<uint8_t> good = ReadFile(PhotoPath("chelsea"));
  JpegInfo info;
  REQUIRE(ReadJpegInfo(good.data(), good.size(), &info).ok());
  Decoder d;
  JpegRegion out;
  auto decode = [&](const std::vector<uint8_t>& b, int w, int h, int c) {
    return d.Decode(b.data(), b.size(), w, h, c, 1, 0, 0, 0, 0, &out);
  };
  // Truncated at many lengths, and with bytes flipped: each a Corruption.
  for (size_t cut : {size_t{2}, size_t{10}, size_t{200}, good.size() / 2, good.size() - 3}) {
    const std::vector<uint8_t> t(good.begin(), good.begin() + cut);
    const Status s = decode(t, info.width, info.height, 3);
    INFO("cut at " << cut << ": " << s.ToString());
    REQUIRE(s.IsCorruption());
  }
  std::mt19937 rng(3);
  int failed = 0;
  for (int k = 0; k < 40; ++k) {
    std::vector<uint8_t> b = good;
    for (int j = 0; j < 8; ++j) b[200 + rng() % (b.size() - 200)] ^= static_cast<uint8_t>(1 + rng() % 255);
    const Status s = decode(b, info.width, info.height, 3);
    REQUIRE((s.ok() || s.IsCorruption()));
    failed += !s.ok();
  }
  REQUIRE(failed > 0);  // damage in entropy-coded data is usually seen
  // The decoder is still good after failures.
  REQUIRE(decode(good, info.width, info.height, 3).ok());
  const Status size = decode(good, info.width + 1, info.height, 3);
  REQUIRE(size.IsCorruption());
  REQUIRE(size.message().find("its record says") != std::string::npos);
  REQUIRE(decode(good, info.width, info.height, 1).IsCorruption());  // colour into one channel
  REQUIRE(decode(std::vector<uint8_t>{1, 2, 3, 4}, 2, 2, 3).IsCorruption());
  // A grayscale JPEG decodes as one channel, and as RGB (PIL's convert).
  const std::vector<uint8_t> gray = ReadFile(PhotoPath("camera"));
  REQUIRE(ReadJpegInfo(gray.data(), gray.size(), &info).ok());
  REQUIRE(info.components == 1);
  REQUIRE(decode(gray, info.width, info.height, 1).ok());
  REQUIRE(decode(gray, info.width, info.height, 3).ok());
}

TEST_CASE("a JPEG field round-trips through a version 2 record", "[jpeg][format]") {
  const std::vector<uint8_t> jpeg = ReadFile(PhotoPath("coffee"));
  JpegInfo info;
  REQUIRE(ReadJpegInfo(jpeg.data(), jpeg.size(), &info).ok());
  Shape s;
  s.ndim = 3;
  s.dims = {3, static_cast<uint32_t>(info.height), static_cast<uint32_t>(info.width), 0};
  const int64_t label = 4;
  FieldData fields[2] = {{DType::kUint8, s, jpeg.data(), Codec::kJpeg, jpeg.size()},
                         {DType::kInt64, Shape{}, &label}};
  std::vector<uint8_t> value(RecordV2Size(fields, 2));
  EncodeRecordV2(11, fields, 2, value.data());
  RecordHeader h;
  REQUIRE(DecodeRecordHeader(11, value.data(), value.size(), &h).ok());
  REQUIRE(VerifyRecordChecksum(11, value.data(), h).ok());
  REQUIRE(h.fields[0].codec == Codec::kJpeg);
  REQUIRE(h.fields[0].bytes == jpeg.size());
  REQUIRE(h.fields[0].shape == s);
  REQUIRE(std::equal(jpeg.begin(), jpeg.end(), value.begin() + h.fields[0].offset));
  REQUIRE(h.fields[1].codec == Codec::kRaw);
  REQUIRE(h.fields[1].offset % kFieldAlign == 0);
  // DecodeField gives the pixels as CHW.
  std::vector<uint8_t> pixels;
  const FieldView v{value.data() + h.fields[0].offset, h.fields[0].bytes, DType::kUint8, s,
                    Codec::kJpeg};
  REQUIRE(DecodeField(v, "record 11", &pixels).ok());
  REQUIRE(pixels.size() == s.NumElements());

  // Damaged entries: an unknown codec, a raw field with an encoded length,
  // a JPEG field that is not uint8 C x H x W.
  auto with = [&](size_t at, uint8_t byte) {
    std::vector<uint8_t> b = value;
    b[at] = byte;
    RecordHeader hh;
    return DecodeRecordHeader(11, b.data(), b.size(), &hh);
  };
  const size_t e0 = kRecordV2HeaderSize, e1 = e0 + kFieldEntrySize;
  REQUIRE(with(e0 + 2, 7).IsCorruption());
  REQUIRE(with(e0 + 3, 1).IsCorruption());
  REQUIRE(with(e1 + 4, 1).IsCorruption());
  REQUIRE(with(e0 + 0, static_cast<uint8_t>(DType::kFloat32)).IsCorruption());
  REQUIRE(with(e0 + 8, 2).IsCorruption());  // 2 channels
  // A damaged JPEG with a good checksum (as written) fails DecodeField by name.
  std::vector<uint8_t> bad = jpeg;
  bad.resize(bad.size() / 3);
  const FieldView bv{bad.data(), bad.size(), DType::kUint8, s, Codec::kJpeg};
  const Status st = DecodeField(bv, "DIR: record 11, field 'image'", &pixels);
  REQUIRE(st.IsCorruption());
  REQUIRE(st.message().find("record 11") != std::string::npos);
}

TEST_CASE("the loader's box decode equals resampling the full decode at scale 1", "[jpeg][loader]") {
  const std::vector<uint8_t> jpeg = ReadFile(PhotoPath("astronaut"));
  JpegInfo info;
  REQUIRE(ReadJpegInfo(jpeg.data(), jpeg.size(), &info).ok());
  const int h = info.height, w = info.width;
  const Shape s{3, {3, static_cast<uint32_t>(h), static_cast<uint32_t>(w), 0}};
  const FieldView v{jpeg.data(), jpeg.size(), DType::kUint8, s, Codec::kJpeg};
  std::vector<uint8_t> full;
  REQUIRE(DecodeField(v, "astronaut", &full).ok());
  const std::vector<double> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  SampleWriter a(3, DType::kUint8, mean, std), b(3, DType::kUint8, mean, std);
  EncodedImageReader reader;
  double worst_mean_error = 0;
  int scaled = 0;
  for (int k = 0; k < 40; ++k) {
    LoaderOptions o;
    o.random_flip = true;
    o.seed = 9;
    o.crop_kind = k % 4 == 0 ? CropKind::kResizeCenter : CropKind::kRandomResized;
    o.resize = 64;
    const int out = k % 2 ? 56 : 112;
    const SamplePlan plan = PlanSample(o, static_cast<uint32_t>(out), 0, k, h, w);
    std::vector<uint8_t> want(static_cast<size_t>(3) * out * out), got(want.size());
    a.Write(full.data(), h, w, plan, out, out, want.data());
    for (bool dct : {false, true}) {
      SamplePlan p = plan;
      REQUIRE(reader.Decode(v, dct, "astronaut", &p).ok());
      b.Write(reader.planes(), reader.height(), reader.width(), p, out, out, got.data());
      INFO("sample " << k << " box " << plan.source.left << "," << plan.source.top << " "
                     << plan.source.width << "x" << plan.source.height << " -> " << out
                     << ", scale " << reader.scale());
      if (!dct || reader.scale() == 1) {
        REQUIRE(got == want);
      } else {
        ++scaled;
        double e = 0;
        for (size_t i = 0; i < got.size(); ++i) e += std::abs(int(got[i]) - int(want[i]));
        worst_mean_error = std::max(worst_mean_error, e / got.size());
      }
    }
  }
  INFO("DCT-scaled samples: " << scaled << ", worst mean absolute error " << worst_mean_error);
  REQUIRE(scaled > 0);
  // The stated bound (docs/format.md): at most 3 levels of 255 on average.
  REQUIRE(worst_mean_error <= 3.0);
}
