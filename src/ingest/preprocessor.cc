#include "preprocessor.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <new>

#include "core/file.h"
#include "core/jpeg_codec.h"
#include "sources_tsv.h"

namespace kiln::ingest {

namespace fs = std::filesystem;

namespace {
image::ResizeSpec SpecOf(const Preprocessing& r) {
  image::ResizeSpec spec;
  spec.resize_shorter = r.resize;
  spec.crop = r.crop;
  spec.squash_w = r.size_w;
  spec.squash_h = r.size_h;
  spec.max_side = r.max_side;
  return spec;
}
}  // namespace

Preprocessor::Preprocessor(const Preprocessing& recipe, const Shape& shape)
    : recipe_(recipe), spec_(SpecOf(recipe)), shape_(shape) {
  record_bytes_ = shape_.NumElements() * DTypeSize(recipe_.dtype);
  mean_.assign(recipe_.mean.begin(), recipe_.mean.end());
  std_.assign(recipe_.std.begin(), recipe_.std.end());
}

Status Preprocessor::FromManifestRecipe(const Preprocessing& recipe, const Shape& shape,
                                        Preprocessor* out) {
  if (!recipe.complete || recipe.source.root.empty() ||
      static_cast<int>(recipe.mean.size()) != recipe.channels ||
      static_cast<int>(recipe.std.size()) != recipe.channels)
    return Status::Corruption(
        "manifest preprocessing lacks what a re-check needs (source, geometry, mean/std); was the "
        "cache made by kiln build?");
  *out = Preprocessor(recipe, shape);
  return Status::OK();
}

Status Preprocessor::Resize(const std::string& root, const SourceItem& item,
                            Scratch* scratch) const {
  std::vector<uint8_t>& bytes = scratch->bytes;
  KILN_RETURN_IF_ERROR(ReadFileBytes(root + "/" + item.rel_path, &bytes));
  if (bytes.empty()) return Status::Corruption("empty file");
  int iw = 0, ih = 0;
  KILN_RETURN_IF_ERROR(image::ReadHeader(bytes.data(), bytes.size(), item.rel_path, &iw, &ih));
  if (static_cast<int64_t>(iw) * ih > recipe_.max_pixels)
    return Status::InvalidArgument(std::to_string(iw) + "x" + std::to_string(ih) +
                                   " is over --max-pixels " + std::to_string(recipe_.max_pixels));
  image::DecodeOptions dopt;
  dopt.channels = recipe_.channels;
  dopt.max_pixels = recipe_.max_pixels;
  KILN_RETURN_IF_ERROR(image::PlanResize(iw, ih, spec_, &dopt.min_width, &dopt.min_height));
  KILN_RETURN_IF_ERROR(
      image::Decode(bytes.data(), bytes.size(), item.rel_path, dopt, &scratch->decoded));
  KILN_RETURN_IF_ERROR(image::ResizeAndCrop(scratch->decoded, spec_, &scratch->resized));
  const image::ImageU8& r = scratch->resized;
  if (whole()) return Status::OK();
  if (r.width != static_cast<int>(shape_.dims[2]) || r.height != static_cast<int>(shape_.dims[1]))
    return Status::InvalidArgument(
        "size " + std::to_string(r.width) + "x" + std::to_string(r.height) +
        " differs from the cache's " + std::to_string(shape_.dims[2]) + "x" +
        std::to_string(shape_.dims[1]) + "; pass --resize/--crop or --size");
  return Status::OK();
}

Status Preprocessor::Process(const std::string& root, const SourceItem& item, Scratch* scratch,
                             void* dst) const {
  KILN_RETURN_IF_ERROR(Resize(root, item, scratch));
  return image::ToCHW(scratch->resized, recipe_.dtype, mean_.data(), std_.data(), dst);
}

namespace {
// call(), with an exception from below (std::bad_alloc from a codec, say)
// turned into an IOError: the environment failed, not the file.
template <typename Call>
Status Guarded(const Call& call) {
  try {
    return call();
  } catch (const std::bad_alloc&) {
    return Status::IOError("out of memory while processing it (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Status::IOError(std::string("processing it failed with an exception: ") + e.what());
  }
}
}  // namespace

Status Preprocessor::TryProcess(const std::string& root, const SourceItem& item, Scratch* scratch,
                                void* dst) const {
  return Guarded([&] { return Process(root, item, scratch, dst); });
}

Status Preprocessor::TryProcessWhole(const std::string& root, const SourceItem& item,
                                     Scratch* scratch, std::vector<uint8_t>* dst, Shape* shape,
                                     Codec* codec) const {
  return Guarded([&] {
    KILN_RETURN_IF_ERROR(Resize(root, item, scratch));
    const image::ImageU8& r = scratch->resized;
    shape->ndim = 3;
    shape->dims = {static_cast<uint32_t>(r.channels), static_cast<uint32_t>(r.height),
                   static_cast<uint32_t>(r.width), 0};
    if (codec != nullptr) *codec = Codec::kRaw;
    const uint64_t raw_bytes = shape->NumElements() * DTypeSize(recipe_.dtype);
    if (!recipe_.encode.empty() && codec != nullptr) {
      // The source's own bytes where they are the record's image as it is:
      // a JPEG of the records' channels (or a grayscale one for RGB records,
      // which the loader decodes to RGB as PIL's convert does) that needed
      // no resize (the decode above proved it whole). Else the pixels
      // encoded.
      const std::vector<uint8_t>& src = scratch->bytes;
      const image::ImageU8& d = scratch->decoded;
      const int sw = d.source_width > 0 ? d.source_width : d.width;
      const int sh = d.source_height > 0 ? d.source_height : d.height;
      internal::JpegInfo info;
      const bool passthrough =
          internal::IsJpeg(src.data(), src.size()) && r.width == sw && r.height == sh &&
          internal::ReadJpegInfo(src.data(), src.size(), &info).ok() &&
          (info.components == r.channels || (info.components == 1 && r.channels == 3));
      if (passthrough) {
        dst->assign(src.begin(), src.end());
      } else {
        KILN_RETURN_IF_ERROR(internal::EncodeJpeg(r.pixels.data(), r.width, r.height, r.channels,
                                                  recipe_.encode_quality, dst));
      }
      if (recipe_.encode == "jpeg" ||
          static_cast<double>(dst->size()) <= kEncodeAutoShare * static_cast<double>(raw_bytes)) {
        *codec = Codec::kJpeg;
        return Status::OK();
      }
    }
    dst->resize(raw_bytes);
    return image::ToCHW(r, recipe_.dtype, mean_.data(), std_.data(), dst->data());
  });
}

Status Preprocessor::TryProcessMask(const SourceItem& item, Scratch* scratch,
                                    std::vector<uint8_t>* dst, Shape* shape) const {
  return Guarded([&] {
    const std::string rel = MaskRelPath(item.rel_path);
    const std::string path = RawName(recipe_.masks) + "/" + rel;
    std::vector<uint8_t> bytes;
    const Status read = ReadFileBytes(path, &bytes);
    if (!read.ok())
      return read.IsNotFound() ? Status::NotFound("its mask " + path +
                                                  " is missing (--masks wants a PNG at "
                                                  "each image's relative path, extension .png)")
                               : read.WithContext("its mask " + path);
    KILN_RETURN_IF_ERROR(
        image::DecodeMask(bytes.data(), bytes.size(), path, recipe_.max_pixels, &scratch->mask));
    const image::ImageU8& img = scratch->decoded;
    const int iw = img.source_width > 0 ? img.source_width : img.width;
    const int ih = img.source_height > 0 ? img.source_height : img.height;
    if (scratch->mask.width != iw || scratch->mask.height != ih)
      return Status::InvalidArgument(
          "its mask " + path + " is " + std::to_string(scratch->mask.width) + "x" +
          std::to_string(scratch->mask.height) + ", the image " + std::to_string(iw) + "x" +
          std::to_string(ih) + ": a mask must have its image's size");
    image::ImageU8 out;
    KILN_RETURN_IF_ERROR(image::ResizeAndCropNearest(scratch->mask, spec_, &out));
    shape->ndim = 2;
    shape->dims = {static_cast<uint32_t>(out.height), static_cast<uint32_t>(out.width), 0, 0};
    dst->swap(out.pixels);
    return Status::OK();
  });
}

Status Preprocessor::PlanShape(const Preprocessing& recipe, const SourceList& src, Shape* out) {
  int w = 0, h = 0;
  if (recipe.whole) {
    // Each record has its own size.
  } else if (recipe.crop > 0) {
    w = h = recipe.crop;
  } else if (recipe.size_w > 0) {
    w = recipe.size_w;
    h = recipe.size_h;
  } else {
    const image::ResizeSpec spec = SpecOf(recipe);
    for (const SourceItem& it : src.items) {
      std::vector<uint8_t> bytes;
      if (!ReadFileBytes(src.root + "/" + it.rel_path, &bytes).ok()) continue;
      int iw, ih;
      if (!image::ReadHeader(bytes.data(), bytes.size(), it.rel_path, &iw, &ih).ok()) continue;
      if (!image::PlanGeometry(iw, ih, spec, &w, &h).ok()) continue;
      break;
    }
    if (w == 0) return Status::InvalidArgument(src.root + ": no readable image to size the cache");
  }
  out->ndim = 3;
  out->dims = {static_cast<uint32_t>(recipe.channels), static_cast<uint32_t>(h),
               static_cast<uint32_t>(w), 0};
  return Status::OK();
}

Status Preprocessor::MeasureStats(const SourceList& src, const std::vector<size_t>& pick,
                                  int threads, std::vector<double>* mean, std::vector<double>* std,
                                  uint64_t* unreadable) const {
  const int c = recipe_.channels;
  std::mutex mu;
  std::vector<uint64_t> sum(c, 0), sq(c, 0);
  uint64_t pixels = 0, transient = 0;
  InArena(threads, [&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, pick.size(), 8), [&](const auto& r) {
      Scratch scratch;
      std::vector<uint64_t> ls(c, 0), lq(c, 0);
      uint64_t lp = 0, lt = 0;
      for (size_t k = r.begin(); k != r.end(); ++k) {
        const Status s = Guarded([&] { return Resize(src.root, src.items[pick[k]], &scratch); });
        if (!s.ok()) {
          lt += s.IsIOError();
          continue;
        }
        const std::vector<uint8_t>& px = scratch.resized.pixels;
        for (size_t p = 0; p < px.size(); ++p) {
          const uint64_t v = px[p];
          ls[p % c] += v;
          lq[p % c] += v * v;
        }
        lp += px.size() / c;
      }
      std::lock_guard<std::mutex> lock(mu);
      for (int i = 0; i < c; ++i) {
        sum[i] += ls[i];
        sq[i] += lq[i];
      }
      pixels += lp;
      transient += lt;
    });
  });
  if (unreadable != nullptr) *unreadable = transient;
  if (pixels == 0) return Status::InvalidArgument("--norm auto: no image could be read");
  mean->resize(c);
  std->resize(c);
  for (int i = 0; i < c; ++i) {
    const double m = static_cast<double>(sum[i]) / pixels;
    const double var = static_cast<double>(sq[i]) / pixels - m * m;
    (*mean)[i] = m / 255.0;
    (*std)[i] = std::sqrt(std::max(var, 0.0)) / 255.0;
    if ((*std)[i] == 0) (*std)[i] = 1.0;
  }
  return Status::OK();
}

}  // namespace kiln::ingest
