#include "kiln/image/render.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "kiln/shuffle.h"
#include "opencv_codecs.h"

namespace kiln::image {
namespace {

// The float value of IEEE binary16 bits.
float HalfBitsToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

// The per-channel statistics of `values` (mean or std) for `channels`
// channels: `fallback` when none are recorded, one value broadcast.
Status ChannelValues(const std::vector<double>& values, int channels, float fallback,
                     const char* name, std::vector<float>* out) {
  out->assign(channels, fallback);
  if (values.empty()) return Status::OK();
  if (values.size() != 1 && values.size() != static_cast<size_t>(channels))
    return Status::InvalidArgument("the manifest's " + std::string(name) + " has " +
                                   std::to_string(values.size()) + " values for " +
                                   std::to_string(channels) + " channels");
  for (int c = 0; c < channels; ++c)
    (*out)[c] = static_cast<float>(values[values.size() == 1 ? 0 : c]);
  return Status::OK();
}

uint8_t ToPixel(float x, float mean, float std) {
  const float v = std::round((x * std + mean) * 255.0f);
  if (!(v >= 0.0f)) return 0;  // NaN too
  return v >= 255.0f ? 255 : static_cast<uint8_t>(v);
}

// The label of record `index` with label `label`.
std::string TileLabel(const Manifest& m, int64_t label, uint64_t index) {
  std::string text = "#" + std::to_string(index);
  if (label >= 0 && static_cast<size_t>(label) < m.classes.size())
    return m.classes[label] + " " + text;
  if (label >= 0) return std::to_string(label) + " " + text;
  return text;
}

std::string Join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

Status RecordToImage(const Manifest& m, const RecordView& record, ImageU8* out) {
  const Shape& shape = record.shape;
  if (shape.ndim != 3 || (shape.dims[0] != 1 && shape.dims[0] != 3))
    return Status::InvalidArgument("record " + std::to_string(record.index) + " has shape " +
                                   shape.ToString() +
                                   ": only C x H x W records with 1 or 3 channels are images");
  // A side of 2^31 or more (a record of 1 x 2^31 x 1, say) is no int.
  if (shape.dims[1] > INT_MAX || shape.dims[2] > INT_MAX)
    return Status::InvalidArgument("record " + std::to_string(record.index) + " has shape " +
                                   shape.ToString() + ": too large to be an image");
  if (!IsPixelDType(record.dtype))
    return Status::InvalidArgument("record " + std::to_string(record.index) + " is " +
                                   DTypeName(record.dtype) +
                                   ": only uint8, float16 and float32 "
                                   "records are images");
  const int c = static_cast<int>(shape.dims[0]);
  const int h = static_cast<int>(shape.dims[1]);
  const int w = static_cast<int>(shape.dims[2]);
  std::vector<float> mean, std;
  Status s = ChannelValues(m.preprocessing.mean, c, 0.0f, "mean", &mean);
  if (s.ok()) s = ChannelValues(m.preprocessing.std, c, 1.0f, "std", &std);
  if (!s.ok()) return s;
  out->width = out->source_width = w;
  out->height = out->source_height = h;
  out->channels = c;
  out->scale_num = out->scale_denom = 1;
  out->pixels.resize(static_cast<size_t>(w) * h * c);
  const size_t plane = static_cast<size_t>(w) * h;
  const uint8_t* data = record.data;
  std::vector<uint8_t> decoded;  // a JPEG record's pixels, CHW
  if (record.codec != Codec::kRaw) {
    KILN_RETURN_IF_ERROR(DecodeField({record.data, record.bytes, record.dtype, shape, record.codec},
                                     "record " + std::to_string(record.index), &decoded));
    data = decoded.data();
  }
  for (int ch = 0; ch < c; ++ch) {
    for (size_t p = 0; p < plane; ++p) {
      const size_t e = ch * plane + p;  // CHW element
      uint8_t v = 0;
      switch (record.dtype) {
        case DType::kUint8:
          v = data[e];
          break;
        case DType::kFloat16: {
          uint16_t bits;
          std::memcpy(&bits, data + 2 * e, 2);
          v = ToPixel(HalfBitsToFloat(bits), mean[ch], std[ch]);
          break;
        }
        case DType::kFloat32: {
          float x;
          std::memcpy(&x, data + 4 * e, 4);
          v = ToPixel(x, mean[ch], std[ch]);
          break;
        }
        case DType::kInt32:
        case DType::kInt64:
          break;  // refused above
      }
      out->pixels[p * c + ch] = v;
    }
  }
  return Status::OK();
}

std::array<uint8_t, 3> MaskColour(int64_t k) {
  // PASCAL VOC's colour map: the bits of k, three at a time, from the top
  // bit of each channel down.
  std::array<uint8_t, 3> c = {0, 0, 0};
  int v = static_cast<int>(((k % 256) + 256) % 256);
  for (int shift = 7; v > 0 && shift >= 0; --shift, v >>= 3)
    for (int ch = 0; ch < 3; ++ch) c[ch] |= static_cast<uint8_t>(((v >> ch) & 1) << shift);
  return c;
}

Status RecordToPicture(const Manifest& m, const RecordView& record, ImageU8* out) {
  KILN_RETURN_IF_ERROR(RecordToImage(m, record, out));
  if (m.fields.empty() || m.image_field < 0 || m.image_field >= record.num_fields)
    return Status::OK();
  const FieldSpec& image = m.fields[m.image_field];
  const FieldView* mask = nullptr;
  const FieldView* boxes = nullptr;
  for (int f = 0; f < record.num_fields && f < static_cast<int>(m.fields.size()); ++f) {
    const FieldView& v = record.fields[f];
    if (IsMaskField(m.fields[f], image) && v.shape.ndim == 2 &&
        v.shape.dims[0] == static_cast<uint32_t>(out->height) &&
        v.shape.dims[1] == static_cast<uint32_t>(out->width))
      mask = &v;
    if (IsBoxesField(m.fields[f])) boxes = &v;
  }
  if (mask == nullptr && (boxes == nullptr || boxes->shape.dims[0] == 0)) return Status::OK();
  if (out->channels == 1) {  // grey, in RGB
    std::vector<uint8_t> rgb(out->pixels.size() * 3);
    for (size_t p = 0; p < out->pixels.size(); ++p)
      rgb[3 * p] = rgb[3 * p + 1] = rgb[3 * p + 2] = out->pixels[p];
    out->pixels.swap(rgb);
    out->channels = 3;
  }
  const size_t pixels = static_cast<size_t>(out->width) * out->height;
  if (mask != nullptr) {
    const size_t size = DTypeSize(mask->dtype);
    for (size_t p = 0; p < pixels; ++p) {
      int64_t k = 0;
      if (size == 1) k = mask->data[p];
      if (size == 4) {
        int32_t x;
        std::memcpy(&x, mask->data + 4 * p, 4);
        k = x;
      }
      if (size == 8) std::memcpy(&k, mask->data + 8 * p, 8);
      if (k == 0) continue;
      const std::array<uint8_t, 3> c = MaskColour(k);
      for (int ch = 0; ch < 3; ++ch) {
        uint8_t& px = out->pixels[3 * p + ch];
        px = static_cast<uint8_t>((px + c[ch] + 1) / 2);
      }
    }
  }
  if (boxes != nullptr) {
    auto put = [&](int64_t x, int64_t y) {
      if (x < 0 || y < 0 || x >= out->width || y >= out->height) return;
      std::memcpy(&out->pixels[3 * (static_cast<size_t>(y) * out->width + x)], kBoxColour.data(),
                  3);
    };
    // Clipped to the image.
    auto clamp = [&](float v, int64_t limit) -> double {
      return std::max(0.0, std::min(static_cast<double>(limit), static_cast<double>(v)));
    };
    for (uint32_t b = 0; b < boxes->shape.dims[0]; ++b) {
      float xy[4];
      std::memcpy(xy, boxes->data + 16 * b, 16);
      if (std::isnan(xy[0]) || std::isnan(xy[1]) || std::isnan(xy[2]) || std::isnan(xy[3]))
        continue;
      const double x1 = clamp(xy[0], out->width), y1 = clamp(xy[1], out->height);
      const double x2 = clamp(xy[2], out->width), y2 = clamp(xy[3], out->height);
      if (!(x2 > x1 && y2 > y1)) continue;  // empty
      const int64_t l = static_cast<int64_t>(std::floor(x1)),
                    t = static_cast<int64_t>(std::floor(y1));
      const int64_t r = static_cast<int64_t>(std::ceil(x2)) - 1,
                    d = static_cast<int64_t>(std::ceil(y2)) - 1;
      for (int64_t x = l; x <= r; ++x) {
        put(x, t);
        put(x, d);
      }
      for (int64_t y = t; y <= d; ++y) {
        put(l, y);
        put(r, y);
      }
    }
  }
  return Status::OK();
}

Status WriteImage(const ImageU8& img, const std::string& path) {
  if (img.channels != 1 && img.channels != 3)
    return Status::InvalidArgument("WriteImage: 1 or 3 channels, not " +
                                   std::to_string(img.channels));
  const cv::Mat view(img.height, img.width, img.channels == 3 ? CV_8UC3 : CV_8UC1,
                     const_cast<uint8_t*>(img.pixels.data()));
  cv::Mat bgr;
  if (img.channels == 3) cv::cvtColor(view, bgr, cv::COLOR_RGB2BGR);
  const internal::OpenCvCodecs* codecs = nullptr;
  KILN_RETURN_IF_ERROR(internal::LoadOpenCvCodecs("to write " + path, &codecs));
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext.empty() || !codecs->have_image_writer(path))
    return Status::InvalidArgument("cannot write " + path + ": give a file name ending in " +
                                   ".png, .jpg, .bmp, .tiff or .webp");
  std::string why;
  const bool written = codecs->imwrite(path, img.channels == 3 ? bgr : view, &why);
  if (written) return Status::OK();
  if (why.empty()) {
    // OpenCV does not say why; the usual reasons are the directory's.
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    const std::string dir = parent.empty() ? "." : parent.string();
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      why = "no directory " + dir;
    else if (::access(dir.c_str(), W_OK) != 0)
      why = dir + ": " + std::strerror(errno);
    else
      why = "the image encoder failed";
  }
  return Status::IOError("cannot write " + path + ": " + why);
}

Status ExportRecord(const CacheReader& reader, uint64_t index, const std::string& path) {
  if (index >= reader.size())
    return Status::InvalidArgument(
        "index " + std::to_string(index) + " is out of range: " + reader.dir() + " holds " +
        std::to_string(reader.size()) + " records" +
        (reader.size() ? " (0.." + std::to_string(reader.size() - 1) + ")" : ""));
  std::unique_ptr<ReadTxn> txn = reader.BeginRead();
  RecordView r;
  Status s = txn->Get(index, &r, /*verify_checksum=*/true);
  ImageU8 img;
  if (s.ok()) s = RecordToPicture(reader.manifest(), r, &img);
  if (s.ok()) s = WriteImage(img, path);
  return s;
}

Shape PreviewShape(const Manifest& m) {
  if (m.shape.ndim == 3) return m.shape;
  if (m.image_field < 0 || m.image_field >= static_cast<int>(m.fields.size())) return Shape{};
  const FieldSpec& image = m.fields[m.image_field];
  if (image.ndim != 3) return Shape{};
  Shape s;
  s.ndim = 3;
  for (int i = 0; i < 3; ++i) s.dims[i] = image.max_dims[i];
  return s;
}

PreviewLayout PlanPreview(const Shape& shape, size_t tiles, const PreviewOptions& options) {
  PreviewLayout l;
  const int h = static_cast<int>(shape.dims[1]), w = static_cast<int>(shape.dims[2]);
  const int longer = std::max(1, std::max(w, h));
  l.scale = std::max(1, (options.min_tile + longer - 1) / longer);
  l.tile_width = w * l.scale;
  l.tile_height = h * l.scale;
  l.columns = options.columns;
  if (l.columns <= 0)
    while (static_cast<size_t>(l.columns) * l.columns < tiles) ++l.columns;
  l.columns = std::max(1, std::min<int>(l.columns, static_cast<int>(tiles)));
  l.rows = static_cast<int>((tiles + l.columns - 1) / l.columns);
  l.width = l.columns * (l.tile_width + kPreviewGap) + kPreviewGap;
  l.height = l.rows * (l.tile_height + kPreviewLabelHeight + kPreviewGap) + kPreviewGap;
  return l;
}

Status PickPreviewRecords(const CacheReader& reader, const PreviewOptions& options,
                          std::vector<uint64_t>* indices) {
  const Manifest& m = reader.manifest();
  indices->clear();
  std::vector<uint64_t> pool;  // the records that qualify, in index order
  if (options.classes.empty()) {
    for (size_t i : SeededSample(reader.size(), options.count, options.seed)) indices->push_back(i);
  } else {
    std::vector<bool> wanted(m.classes.size(), false);
    for (const std::string& name : options.classes) {
      const auto it = std::find(m.classes.begin(), m.classes.end(), name);
      if (it == m.classes.end())
        return Status::InvalidArgument("--classes: no class '" + name + "'" +
                                       (m.classes.empty()
                                            ? "; the cache records no class names"
                                            : "; the cache's classes are " + Join(m.classes)));
      wanted[it - m.classes.begin()] = true;
    }
    std::unique_ptr<ReadTxn> txn = reader.BeginRead();
    for (uint64_t i = 0; i < reader.size(); ++i) {
      RecordView r;
      Status s = txn->Get(i, &r);
      if (!s.ok()) return s;
      if (r.label >= 0 && static_cast<size_t>(r.label) < wanted.size() && wanted[r.label])
        pool.push_back(i);
    }
    for (size_t k : SeededSample(pool.size(), options.count, options.seed))
      indices->push_back(pool[k]);
  }
  if (indices->empty())
    return Status::InvalidArgument(
        reader.dir() + " holds no record of " +
        (options.classes.empty() ? "any class" : "the classes " + Join(options.classes)));
  return Status::OK();
}

Status RenderPreview(const CacheReader& reader, const std::vector<uint64_t>& indices,
                     const PreviewOptions& options, ImageU8* sheet) {
  if (indices.empty()) return Status::InvalidArgument("a preview of no records");
  const Manifest& m = reader.manifest();
  const Shape shape = PreviewShape(m);
  if (shape.ndim != 3)
    return Status::InvalidArgument(reader.dir() + " holds records of shape " + m.shape.ToString() +
                                   ", not C x H x W images");
  // Bounds that keep PlanPreview's int arithmetic from overflowing and the
  // sheet to a size a PNG viewer opens (a manifest's shape may be anything
  // up to kMaxRecordElements).
  if (shape.dims[1] > kMaxPreviewSide || shape.dims[2] > kMaxPreviewSide ||
      indices.size() > kMaxPreviewTiles || options.min_tile > static_cast<int>(kMaxPreviewSide))
    return Status::InvalidArgument(
        "a contact sheet of " + std::to_string(indices.size()) + " records of " + shape.ToString() +
        ": at most " + std::to_string(kMaxPreviewTiles) + " records with sides up to " +
        std::to_string(kMaxPreviewSide) + " pixels (kiln export writes one record as an image)");
  const PreviewLayout l = PlanPreview(shape, indices.size(), options);
  if (static_cast<int64_t>(l.width) * l.height > kMaxPreviewPixels)
    return Status::InvalidArgument("a contact sheet of " + std::to_string(indices.size()) +
                                   " records of " + shape.ToString() + " would be " +
                                   std::to_string(l.width) + "x" + std::to_string(l.height) +
                                   " pixels; draw fewer records (--count)");
  cv::Mat canvas(l.height, l.width, CV_8UC3, cv::Scalar(40, 40, 40));  // RGB
  std::unique_ptr<ReadTxn> txn = reader.BeginRead();
  constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;
  for (size_t t = 0; t < indices.size(); ++t) {
    RecordView r;
    Status s = txn->Get(indices[t], &r, /*verify_checksum=*/true);
    ImageU8 img;
    if (s.ok()) s = RecordToPicture(m, r, &img);
    if (!s.ok()) return s;
    // A whole image larger than the manifest says is damage.
    if (img.width * l.scale > l.tile_width || img.height * l.scale > l.tile_height)
      return Status::Corruption("record " + std::to_string(indices[t]) + " is " +
                                std::to_string(img.width) + "x" + std::to_string(img.height) +
                                ", larger than the largest size the manifest records");
    const cv::Mat src(img.height, img.width, img.channels == 3 ? CV_8UC3 : CV_8UC1,
                      img.pixels.data());
    cv::Mat rgb, big;
    if (img.channels == 1)
      cv::cvtColor(src, rgb, cv::COLOR_GRAY2RGB);
    else
      rgb = src;
    cv::resize(rgb, big, cv::Size(img.width * l.scale, img.height * l.scale), 0, 0,
               cv::INTER_NEAREST);
    const int x = kPreviewGap + static_cast<int>(t % l.columns) * (l.tile_width + kPreviewGap);
    const int y = kPreviewGap + static_cast<int>(t / l.columns) *
                                    (l.tile_height + kPreviewLabelHeight + kPreviewGap);
    big.copyTo(canvas(cv::Rect(x, y, big.cols, big.rows)));
    // The label, shrunk to fit the tile's width and the strip's height.
    const std::string text = TileLabel(m, r.label, indices[t]);
    double font_scale = 0.4;
    int baseline = 0;
    const cv::Size size = cv::getTextSize(text, kFont, font_scale, 1, &baseline);
    if (size.width > l.tile_width - 2)
      font_scale = std::max(0.1, font_scale * (l.tile_width - 2.0) / size.width);
    const cv::Size fit = cv::getTextSize(text, kFont, font_scale, 1, &baseline);
    cv::putText(canvas(cv::Rect(x, y + l.tile_height, l.tile_width, kPreviewLabelHeight)), text,
                cv::Point(1, (kPreviewLabelHeight + fit.height) / 2), kFont, font_scale,
                cv::Scalar(255, 255, 255), 1, cv::LINE_AA);
  }
  sheet->width = sheet->source_width = l.width;
  sheet->height = sheet->source_height = l.height;
  sheet->channels = 3;
  sheet->scale_num = sheet->scale_denom = 1;
  sheet->pixels.assign(canvas.data, canvas.data + canvas.total() * canvas.elemSize());
  return Status::OK();
}

Status WritePreview(const CacheReader& reader, const PreviewOptions& options,
                    const std::string& path, std::vector<uint64_t>* shown) {
  std::vector<uint64_t> indices;
  Status s = PickPreviewRecords(reader, options, &indices);
  ImageU8 sheet;
  if (s.ok()) s = RenderPreview(reader, indices, options, &sheet);
  if (s.ok()) s = WriteImage(sheet, path);
  if (s.ok() && shown != nullptr) *shown = indices;
  return s;
}

}  // namespace kiln::image
