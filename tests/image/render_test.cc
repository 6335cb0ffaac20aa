// Tests for kiln::image's pictures of records: kiln export's de-normalized
// image of one record, and kiln preview's contact sheet and sample.
#include "kiln/image/render.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <opencv2/imgcodecs.hpp>
#include <set>

#include "kiln/cache_writer.h"
#include "kiln/image/transform.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Element e of record i: values from -3 to 3, so that de-normalized pixels
// fall below 0 and above 255 as well as between.
float Element(uint64_t i, size_t e, size_t n) {
  return -3.0f + 6.0f * static_cast<float>((e * 7 + i * 13) % n) / static_cast<float>(n - 1);
}

// Writes `n` records of `shape` (labels i % 10, classes class0..class9)
// with the recipe JSON `recipe` ("{}": none).
void WriteCache(const std::string& dir, uint64_t n, DType dtype, const Shape& shape,
                const std::string& recipe) {
  WriterOptions o;
  o.dtype = dtype;
  o.shape = shape;
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir, &w).ok());
  const size_t elems = shape.NumElements();
  std::vector<uint8_t> payload(elems * DTypeSize(dtype));
  for (uint64_t i = 0; i < n; ++i) {
    for (size_t e = 0; e < elems; ++e) {
      const float x = Element(i, e, elems);
      if (dtype == DType::kUint8) payload[e] = static_cast<uint8_t>((e * 31 + i * 17) % 256);
      if (dtype == DType::kFloat32) std::memcpy(&payload[4 * e], &x, 4);
      if (dtype == DType::kFloat16) {
        const uint16_t h = image::FloatToHalf(x);
        std::memcpy(&payload[2 * e], &h, 2);
      }
    }
    REQUIRE(w->Append(i, static_cast<int64_t>(i % 10), payload.data()).ok());
  }
  Manifest m;
  for (int c = 0; c < 10; ++c) m.classes.push_back("class" + std::to_string(c));
  REQUIRE(Preprocessing::FromJson(recipe, "test", &m.preprocessing).ok());
  REQUIRE(w->Finish(&m).ok());
}

std::unique_ptr<CacheReader> Open(const std::string& dir) {
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir, ReaderOptions(), &r).ok());
  return r;
}

// Element e of a stored record, as a float (written here, not by kiln).
float StoredElement(const RecordView& r, size_t e) {
  if (r.dtype == DType::kFloat32) {
    float x;
    std::memcpy(&x, r.data + 4 * e, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, r.data + 2 * e, 2);
  const int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1 : 1;
  if (exponent == 0) return static_cast<float>(sign * std::ldexp(mantissa, -24));
  return static_cast<float>(sign * std::ldexp(1024 + mantissa, exponent - 25));
}

// The pixel of element x de-normalized with mean m and std s.
int Denormalized(float x, float m, float s) {
  const float v = std::round((x * s + m) * 255.0f);
  return v < 0 ? 0 : v > 255 ? 255 : static_cast<int>(v);
}

// Channel c of pixel (x, y) of an image OpenCV read (BGR for 3 channels).
int PixelAt(const cv::Mat& img, int x, int y, int c) {
  if (img.channels() == 1) return img.at<uint8_t>(y, x);
  return img.at<cv::Vec3b>(y, x)[2 - c];
}

}  // namespace

TEST_CASE("an exported float record is the de-normalized record, pixel for pixel", "[render]") {
  TempDir dir;
  struct Case {
    DType dtype;
    int channels;
    std::string recipe;
    std::vector<float> mean, std;
  };
  const Case cases[] = {
      {DType::kFloat16,
       3,
       R"({"mean": [0.2, 0.5, 0.8], "std": [0.3, 0.2, 0.1]})",
       {0.2f, 0.5f, 0.8f},
       {0.3f, 0.2f, 0.1f}},
      {DType::kFloat32,
       3,
       R"({"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]})",
       {0.485f, 0.456f, 0.406f},
       {0.229f, 0.224f, 0.225f}},
      {DType::kFloat32, 1, R"({"mean": [0.286], "std": [0.353]})", {0.286f}, {0.353f}},
      {DType::kFloat16, 1, "{}", {0.0f}, {1.0f}},  // no recipe: mean 0, std 1
  };
  int k = 0;
  for (const Case& c : cases) {
    CAPTURE(DTypeName(c.dtype), c.channels, c.recipe);
    const std::string cache = dir / ("cache" + std::to_string(k++));
    const int h = 5, w = 7;
    WriteCache(cache, 4, c.dtype, MakeShape({static_cast<uint32_t>(c.channels), h, w}), c.recipe);
    auto reader = Open(cache);
    const std::string png = cache + ".png";
    REQUIRE(image::ExportRecord(*reader, 2, png).ok());
    const cv::Mat img = cv::imread(png, cv::IMREAD_UNCHANGED);
    REQUIRE(img.rows == h);
    REQUIRE(img.cols == w);
    REQUIRE(img.channels() == c.channels);
    auto txn = reader->BeginRead();
    RecordView r;
    REQUIRE(txn->Get(2, &r).ok());
    int clamped_low = 0, clamped_high = 0;
    for (int ch = 0; ch < c.channels; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const int want =
              Denormalized(StoredElement(r, (ch * h + y) * w + x), c.mean[ch], c.std[ch]);
          clamped_low += want == 0;
          clamped_high += want == 255;
          CAPTURE(ch, y, x);
          REQUIRE(PixelAt(img, x, y, ch) == want);
        }
    CHECK(clamped_low > 0);  // the values reach past both ends
    CHECK(clamped_high > 0);
  }
}

TEST_CASE("an exported uint8 3-channel record is the record's bytes", "[render]") {
  TempDir dir;
  const int h = 6, w = 9;
  WriteCache(dir / "c", 3, DType::kUint8, MakeShape({3, h, w}), "{}");
  auto reader = Open(dir / "c");
  REQUIRE(image::ExportRecord(*reader, 1, dir / "one.png").ok());
  const cv::Mat img = cv::imread(dir / "one.png", cv::IMREAD_UNCHANGED);
  REQUIRE(img.channels() == 3);
  REQUIRE(img.rows == h);
  REQUIRE(img.cols == w);
  auto txn = reader->BeginRead();
  RecordView r;
  REQUIRE(txn->Get(1, &r).ok());
  for (int ch = 0; ch < 3; ++ch)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        CAPTURE(ch, y, x);
        REQUIRE(PixelAt(img, x, y, ch) == r.data[(ch * h + y) * w + x]);
      }
}

TEST_CASE("export refuses an index past the end and a file it cannot write", "[render]") {
  TempDir dir;
  WriteCache(dir / "c", 3, DType::kUint8, MakeShape({1, 4, 4}), "{}");
  auto reader = Open(dir / "c");
  Status s = image::ExportRecord(*reader, 3, dir / "x.png");
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("index 3") && Catch::Contains("holds 3 records"));
  s = image::ExportRecord(*reader, 0, dir / "no/such/dir/x.png");
  CHECK(s.IsIOError());
  CHECK_THAT(s.message(), Catch::Contains(dir / "no/such/dir/x.png"));
  s = image::ExportRecord(*reader, 0, dir / "x.nosuchformat");
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("x.nosuchformat"));
}

TEST_CASE("a preview sheet: its size, and each tile the upscaled record", "[render]") {
  TempDir dir;
  WriteCache(dir / "c", 30, DType::kUint8, MakeShape({1, 28, 28}), "{}");
  auto reader = Open(dir / "c");
  image::PreviewOptions o;
  o.count = 10;
  o.seed = 5;
  std::vector<uint64_t> shown;
  REQUIRE(image::WritePreview(*reader, o, dir / "grid.png", &shown).ok());
  REQUIRE(shown.size() == 10);
  // 28 x 28 records scaled by 4, the smallest factor reaching min_tile 96;
  // 10 tiles in 4 columns (4 x 4 >= 10 > 3 x 3) and 3 rows.
  const int scale = 4, tile = 28 * scale, columns = 4, rows = 3;
  const cv::Mat img = cv::imread(dir / "grid.png", cv::IMREAD_UNCHANGED);
  REQUIRE(img.channels() == 3);
  CHECK(img.cols == columns * (tile + image::kPreviewGap) + image::kPreviewGap);
  CHECK(img.rows ==
        rows * (tile + image::kPreviewLabelHeight + image::kPreviewGap) + image::kPreviewGap);
  auto txn = reader->BeginRead();
  for (int t = 0; t < columns * rows; ++t) {
    const int x0 = image::kPreviewGap + (t % columns) * (tile + image::kPreviewGap);
    const int y0 = image::kPreviewGap +
                   (t / columns) * (tile + image::kPreviewLabelHeight + image::kPreviewGap);
    CAPTURE(t);
    if (t >= 10) {  // past the last tile: background only
      CHECK(img.at<cv::Vec3b>(y0 + tile / 2, x0 + tile / 2) == img.at<cv::Vec3b>(0, 0));
      continue;
    }
    RecordView r;
    REQUIRE(txn->Get(shown[t], &r).ok());
    for (int y = 0; y < tile; ++y)
      for (int x = 0; x < tile; ++x) {
        const int want = r.data[(y / scale) * 28 + x / scale];
        const cv::Vec3b got = img.at<cv::Vec3b>(y0 + y, x0 + x);
        if (got[0] != want || got[1] != want || got[2] != want) {
          CAPTURE(x, y, want, static_cast<int>(got[0]));
          FAIL("tile pixel differs from the record");
        }
      }
  }
}

TEST_CASE("PlanPreview: whole upscaling, columns, never scaled down", "[render]") {
  image::PreviewOptions o;
  image::PreviewLayout l = image::PlanPreview(MakeShape({3, 224, 200}), 5, o);
  CHECK(l.scale == 1);
  CHECK(l.tile_width == 200);
  CHECK(l.tile_height == 224);
  CHECK(l.columns == 3);
  CHECK(l.rows == 2);
  o.columns = 5;
  o.min_tile = 100;
  l = image::PlanPreview(MakeShape({1, 32, 32}), 12, o);
  CHECK(l.scale == 4);
  CHECK(l.columns == 5);
  CHECK(l.rows == 3);
  CHECK(l.width == 5 * (128 + image::kPreviewGap) + image::kPreviewGap);
}

TEST_CASE("records too large for a picture are refused, not a crash", "[render]") {
  // Regression: a manifest may give any shape up to 2^40 elements. A side of
  // 2^30 overflowed PlanPreview's int arithmetic (undefined behaviour, then
  // an exception out of cv::Mat), and RecordToImage took a side of 2^31 as a
  // negative int (std::length_error from resize).
  TempDir dir;
  WriteCache(dir / "c", 30, DType::kUint8, MakeShape({1, 28, 28}), "{}");
  std::string m = ReadFile(dir / "c/manifest.json");
  const size_t at = m.find("      28,\n      28\n");
  REQUIRE(at != std::string::npos);
  m.replace(at, 20, "      1,\n      1073741824\n");
  WriteFile(dir / "c/manifest.json", m);
  auto reader = Open(dir / "c");
  REQUIRE(reader->manifest().shape.dims[2] == (1u << 30));
  image::PreviewOptions o;
  image::ImageU8 sheet;
  Status s = image::RenderPreview(*reader, {0, 1, 2, 3}, o, &sheet);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("1x1x1073741824"));
  // Too many tiles, even of small records.
  WriteCache(dir / "small", 2, DType::kUint8, MakeShape({1, 28, 28}), "{}");
  auto small = Open(dir / "small");
  s = image::RenderPreview(*small, std::vector<uint64_t>(image::kMaxPreviewTiles + 1, 0), o,
                           &sheet);
  CHECK(s.IsInvalidArgument());
  // One record of 1 x 2^31 x 1 as an image (the view is all RecordToImage reads).
  RecordView r;
  r.dtype = DType::kUint8;
  r.shape = MakeShape({1, 1u << 31, 1});
  CHECK(image::RecordToImage(reader->manifest(), r, &sheet).IsInvalidArgument());
}

TEST_CASE("preview --classes: the sample holds only the chosen classes", "[render]") {
  TempDir dir;
  WriteCache(dir / "c", 30, DType::kUint8, MakeShape({1, 8, 8}), "{}");
  auto reader = Open(dir / "c");
  image::PreviewOptions o;
  o.classes = {"class3", "class7"};
  o.count = 4;
  std::vector<uint64_t> picked;
  REQUIRE(image::PickPreviewRecords(*reader, o, &picked).ok());
  REQUIRE(picked.size() == 4);
  std::set<uint64_t> distinct(picked.begin(), picked.end());
  CHECK(distinct.size() == 4);
  for (uint64_t i : picked) CHECK((i % 10 == 3 || i % 10 == 7));
  std::vector<uint64_t> again;
  REQUIRE(image::PickPreviewRecords(*reader, o, &again).ok());
  CHECK(again == picked);  // the same seed, the same sample
  o.count = 100;           // more than qualify: every record of the classes
  REQUIRE(image::PickPreviewRecords(*reader, o, &picked).ok());
  CHECK(picked == std::vector<uint64_t>{3, 7, 13, 17, 23, 27});
  o.classes = {"class3", "clas7"};
  Status s = image::PickPreviewRecords(*reader, o, &picked);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("clas7") && Catch::Contains("class0, class1"));
}

namespace {

// A format 2 cache of `n` grey images of their own sizes (8 + i rows x 10 +
// 2i columns, pixel value (x * 7 + y * 3 + i) % 200), each with a mask
// (class 1 + i in a 3x2 block at (2, 1), class 0 elsewhere) and two boxes
// (one inside the image, one running past its right edge), label i % 2.
void WriteAnnotatedCache(const std::string& dir, uint64_t n) {
  WriterOptions o;
  FieldSpec image{"image", DType::kUint8, 3, {1, FieldSpec::kVariableDim, FieldSpec::kVariableDim}};
  FieldSpec mask{"mask", DType::kUint8, 2, {FieldSpec::kVariableDim, FieldSpec::kVariableDim}};
  FieldSpec boxes{"boxes", DType::kFloat32, 2, {FieldSpec::kVariableDim, 4}};
  FieldSpec label{"label", DType::kInt64, 0, {}};
  o.fields = {image, mask, boxes, label};
  o.label_field = "label";
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir, &w).ok());
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t h = 8 + static_cast<uint32_t>(i), wd = 10 + 2 * static_cast<uint32_t>(i);
    std::vector<uint8_t> px(h * wd), m(h * wd, 0);
    for (uint32_t y = 0; y < h; ++y)
      for (uint32_t x = 0; x < wd; ++x)
        px[y * wd + x] = static_cast<uint8_t>((x * 7 + y * 3 + i) % 200);
    for (uint32_t y = 1; y < 3; ++y)
      for (uint32_t x = 2; x < 5; ++x) m[y * wd + x] = static_cast<uint8_t>(1 + i);
    const float b[8] = {0.5f, 4.0f, 3.2f, 7.0f, 6.0f, 0.0f, 1000.0f, 2.5f};
    const int64_t lab = static_cast<int64_t>(i % 2);
    FieldData f[4] = {{DType::kUint8, MakeShape({1, h, wd}), px.data()},
                      {DType::kUint8, MakeShape({h, wd}), m.data()},
                      {DType::kFloat32, MakeShape({2, 4}), b},
                      {DType::kInt64, Shape{}, &lab}};
    REQUIRE(w->AppendFields(i, f, 4).ok());
  }
  Manifest meta;
  meta.classes = {"even", "odd"};
  REQUIRE(w->Finish(&meta).ok());
}

}  // namespace

TEST_CASE("mask colours are PASCAL VOC's colour map", "[render]") {
  using C = std::array<uint8_t, 3>;
  CHECK(image::MaskColour(0) == C{0, 0, 0});
  CHECK(image::MaskColour(1) == C{128, 0, 0});
  CHECK(image::MaskColour(2) == C{0, 128, 0});
  CHECK(image::MaskColour(3) == C{128, 128, 0});
  CHECK(image::MaskColour(4) == C{0, 0, 128});
  CHECK(image::MaskColour(7) == C{128, 128, 128});
  CHECK(image::MaskColour(15) == C{192, 128, 128});
  CHECK(image::MaskColour(19) == C{128, 192, 0});
  CHECK(image::MaskColour(255) == C{224, 224, 192});
  CHECK(image::MaskColour(257) == image::MaskColour(1));
}

TEST_CASE("export draws a record's mask and boxes over its image", "[render]") {
  TempDir dir;
  WriteAnnotatedCache(dir / "c", 3);
  auto reader = Open(dir / "c");
  REQUIRE(image::ExportRecord(*reader, 2, dir / "r2.png").ok());
  const cv::Mat img = cv::imread(dir / "r2.png", cv::IMREAD_COLOR);  // BGR
  REQUIRE(img.rows == 10);
  REQUIRE(img.cols == 14);
  // Box 1: columns 0..3, rows 4..6; box 2: columns 6..13 (clipped at the
  // right edge), rows 0..2.
  auto on_box = [](int x, int y) {
    const bool b1 = ((x == 0 || x == 3) && y >= 4 && y <= 6) || ((y == 4 || y == 6) && x <= 3);
    const bool b2 = ((x == 6 || x == 13) && y <= 2) || ((y == 0 || y == 2) && x >= 6);
    return b1 || b2;
  };
  const std::array<uint8_t, 3> cls = image::MaskColour(3);
  for (int y = 0; y < img.rows; ++y)
    for (int x = 0; x < img.cols; ++x) {
      const int grey = (x * 7 + y * 3 + 2) % 200;
      std::array<int, 3> want = {grey, grey, grey};  // RGB
      if (x >= 2 && x < 5 && y >= 1 && y < 3)
        for (int c = 0; c < 3; ++c) want[c] = (grey + cls[c] + 1) / 2;
      if (on_box(x, y))
        for (int c = 0; c < 3; ++c) want[c] = image::kBoxColour[c];
      const cv::Vec3b got = img.at<cv::Vec3b>(y, x);
      CAPTURE(x, y);
      CHECK(std::array<int, 3>{got[2], got[1], got[0]} == want);
    }
}

TEST_CASE("a preview of whole images: tiles of the largest size, each record at its own",
          "[render]") {
  TempDir dir;
  WriteAnnotatedCache(dir / "c", 4);
  auto reader = Open(dir / "c");
  CHECK(image::PreviewShape(reader->manifest()) == MakeShape({1, 11, 16}));
  image::PreviewOptions o;
  o.count = 4;
  o.min_tile = 30;  // 16 x 2 >= 30: scale 2
  std::vector<uint64_t> shown;
  REQUIRE(image::WritePreview(*reader, o, dir / "grid.png", &shown).ok());
  REQUIRE(shown == std::vector<uint64_t>{0, 1, 2, 3});
  const int scale = 2, tw = 16 * scale, th = 11 * scale;
  const cv::Mat img = cv::imread(dir / "grid.png", cv::IMREAD_COLOR);
  REQUIRE(img.cols == 2 * (tw + image::kPreviewGap) + image::kPreviewGap);
  REQUIRE(img.rows ==
          2 * (th + image::kPreviewLabelHeight + image::kPreviewGap) + image::kPreviewGap);
  auto txn = reader->BeginRead();
  for (int t = 0; t < 4; ++t) {
    RecordView r;
    REQUIRE(txn->Get(t, &r).ok());
    image::ImageU8 pic;
    REQUIRE(image::RecordToPicture(reader->manifest(), r, &pic).ok());
    const int x0 = image::kPreviewGap + (t % 2) * (tw + image::kPreviewGap);
    const int y0 =
        image::kPreviewGap + (t / 2) * (th + image::kPreviewLabelHeight + image::kPreviewGap);
    for (int y = 0; y < th; ++y)
      for (int x = 0; x < tw; ++x) {
        const cv::Vec3b got = img.at<cv::Vec3b>(y0 + y, x0 + x);
        std::array<int, 3> want = {40, 40, 40};  // past the record: the sheet's background
        if (x < pic.width * scale && y < pic.height * scale) {
          const uint8_t* p = &pic.pixels[3 * ((y / scale) * pic.width + x / scale)];
          want = {p[0], p[1], p[2]};
        }
        if (std::array<int, 3>{got[2], got[1], got[0]} != want) {
          CAPTURE(t, x, y);
          FAIL("tile pixel differs from the record's picture");
        }
      }
  }
}
