#include "kiln/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <xxhash.h>

#include "core/json_read.h"
#include "core/file.h"

#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "0.0.0"
#endif

namespace kiln {

using nlohmann::json;

bool FieldSpec::fixed() const {
  for (int i = 0; i < ndim; ++i)
    if (dims[i] == kVariableDim) return false;
  return true;
}

Shape FieldSpec::FixedShape() const {
  Shape s;
  s.ndim = ndim;
  for (int i = 0; i < ndim; ++i) s.dims[i] = static_cast<uint32_t>(dims[i]);
  return s;
}

std::string FieldSpec::ShapeText() const {
  if (ndim == 0) return "()";
  std::string t;
  for (int i = 0; i < ndim; ++i) {
    if (i) t += "x";
    t += dims[i] == kVariableDim ? std::string("?") : std::to_string(dims[i]);
  }
  return t;
}

bool FieldSpec::Admits(DType d, const Shape& s, Codec c) const {
  if (d != dtype || s.ndim != ndim || (c != Codec::kRaw && c != codec)) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[i] != kVariableDim && static_cast<int64_t>(s.dims[i]) != dims[i]) return false;
  return true;
}

namespace {
// The bytes [offset, offset + n) of a value held in up to three pieces, or
// nullptr when they straddle two pieces (a reader never splits a field).
const uint8_t* ValueBytes(uint64_t offset, uint64_t n, const uint8_t* head, size_t head_len,
                          const uint8_t* mid, size_t mid_len, const uint8_t* tail) {
  if (offset + n <= head_len) return head + offset;
  if (offset >= head_len && offset + n <= head_len + mid_len) return mid + (offset - head_len);
  if (offset >= head_len + mid_len && tail != nullptr) return tail + (offset - head_len - mid_len);
  return nullptr;
}
}  // namespace

namespace {
// The label of this cache that a record's stored label means (the
// shard's label_map, when it has one).
Status MapLabel(const ShardInfo* shard, uint64_t index, int64_t* label) {
  if (shard == nullptr || shard->label_map.empty() || *label < 0) return Status::OK();
  if (static_cast<uint64_t>(*label) >= shard->label_map.size())
    return Status::Corruption("record " + std::to_string(index) + " has label " +
                              std::to_string(*label) + ", outside the " +
                              std::to_string(shard->label_map.size()) +
                              " classes of the cache its shard " + shard->file +
                              " was linked from");
  *label = shard->label_map[*label];
  return Status::OK();
}
}  // namespace

Status ResolveRecord(const Manifest& m, uint64_t index, const uint8_t* head, size_t head_len,
                     const uint8_t* mid, size_t mid_len, const uint8_t* tail, RecordHeader* h,
                     const ShardInfo* shard) {
  auto name = [index] { return "record " + std::to_string(index); };
  const bool v2 = m.format_version == kFormatVersion2;
  if (h->version != (v2 ? kRecordVersion2 : kRecordVersion))
    return Status::Corruption(name() + " is a version " + std::to_string(h->version) +
                              " record in a format " + std::to_string(m.format_version) + " cache");
  if (!v2) {
    KILN_RETURN_IF_ERROR(MapLabel(shard, index, &h->label));
    return CheckRecordAgainstManifest(m, index, *h);
  }
  if (h->num_fields != static_cast<int>(m.fields.size()))
    return Status::Corruption(name() + " has " + std::to_string(h->num_fields) +
                              " fields, the manifest declares " + std::to_string(m.fields.size()));
  for (int f = 0; f < h->num_fields; ++f) {
    const FieldEntry& e = h->fields[f];
    const FieldSpec& spec = m.fields[f];
    if (!spec.Admits(e.dtype, e.shape, e.codec))
      return Status::Corruption(name() + ", field '" + spec.name + "' is " + DTypeName(e.dtype) +
                                " " + e.shape.ToString() +
                                (e.codec != Codec::kRaw ? std::string(" ") + CodecName(e.codec)
                                                        : std::string()) +
                                ", the manifest says " + DTypeName(spec.dtype) + " " +
                                spec.ShapeText() +
                                (spec.codec != Codec::kRaw
                                     ? std::string(" ") + CodecName(spec.codec)
                                     : std::string()));
  }
  const FieldEntry& image = h->fields[m.image_field];
  h->dtype = image.dtype;
  h->shape = image.shape;
  h->payload_bytes = image.bytes;
  h->label = -1;
  if (m.label_field >= 0) {
    const FieldEntry& e = h->fields[m.label_field];
    const uint8_t* p = ValueBytes(e.offset, e.bytes, head, head_len, mid, mid_len, tail);
    if (p == nullptr) return Status::InvalidArgument(name() + ": the label field was not read");
    if (e.dtype == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, p, 8);
      h->label = v;
    } else {
      int32_t v;
      std::memcpy(&v, p, 4);
      h->label = v;
    }
    KILN_RETURN_IF_ERROR(MapLabel(shard, index, &h->label));
    if (!m.classes.empty() && (h->label < 0 || h->label >= static_cast<int64_t>(m.classes.size())))
      return Status::Corruption(name() + " has label " + std::to_string(h->label) +
                                ", outside the " + std::to_string(m.classes.size()) + " classes");
  }
  return Status::OK();
}

Status CheckRecordAgainstManifest(const Manifest& m, uint64_t index, const RecordHeader& h) {
  if (h.dtype != m.dtype || h.shape != m.shape)
    return Status::Corruption("record " + std::to_string(index) + " is " + DTypeName(h.dtype) +
                              " " + h.shape.ToString() + ", the manifest says " +
                              DTypeName(m.dtype) + " " + m.shape.ToString());
  if (!m.classes.empty() && (h.label < 0 || h.label >= static_cast<int64_t>(m.classes.size())))
    return Status::Corruption("record " + std::to_string(index) + " has label " +
                              std::to_string(h.label) + ", outside the " +
                              std::to_string(m.classes.size()) + " classes");
  return Status::OK();
}

Status InputNormalization(const Manifest& m, const std::string& dir, std::vector<double>* mean,
                          std::vector<double>* std) {
  mean->clear();
  std->clear();
  if (m.dtype != DType::kUint8) return Status::OK();
  // The image field's channels: its first dim when CHW (fixed even where
  // H and W vary, as in a cache of whole images).
  uint32_t channels = m.shape.ndim == 3 ? m.shape.dims[0] : 1;
  if (!m.fields.empty()) {
    const FieldSpec& image = m.fields[m.image_field];
    channels = image.ndim == 3 && image.dims[0] > 0 ? static_cast<uint32_t>(image.dims[0]) : 1;
  }
  const Preprocessing& p = m.preprocessing;
  bool fits = p.mean.size() == channels && p.std.size() == channels;
  for (size_t c = 0; fits && c < channels; ++c) fits = p.std[c] > 0;
  if (!fits)
    return Status::Corruption(dir + "/" + kManifestName +
                              ": a uint8 cache needs a mean and a positive std per channel (" +
                              std::to_string(channels) +
                              ") in its preprocessing to be normalized; rebuild it with --mean "
                              "and --std (or --norm auto)");
  *mean = p.mean;
  *std = p.std;
  return Status::OK();
}

const char* KilnVersion() { return KILN_VERSION_STRING; }

std::string DigestHex(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, digest);
  return buf;
}

int Manifest::ShardFor(uint64_t index) const {
  if (index < first_index || index - first_index >= count) return -1;
  auto it = std::upper_bound(shards.begin(), shards.end(), index,
                             [](uint64_t i, const ShardInfo& s) { return i < s.first; });
  if (it == shards.begin()) return -1;
  const int s = static_cast<int>(it - shards.begin()) - 1;
  return index < shards[s].first + shards[s].count ? s : -1;
}


// Whether the n fields of record `index` fit the declared `specs` (and,
// with `within_max`, the largest sizes the specs record): InvalidArgument
// naming the record and the field otherwise.
Status CheckFieldsFit(const std::vector<FieldSpec>& specs, uint64_t index, const FieldData* fields,
                      int n, bool within_max) {
  if (n != static_cast<int>(specs.size()))
    return Status::InvalidArgument("record " + std::to_string(index) + " has " + std::to_string(n) +
                                   " fields, the cache declares " + std::to_string(specs.size()));
  for (int f = 0; f < n; ++f) {
    const FieldSpec& spec = specs[f];
    const FieldData& d = fields[f];
    uint64_t elements = 1;
    bool bounded = d.shape.ndim >= 0 && d.shape.ndim <= kMaxDims;
    for (int i = 0; bounded && i < d.shape.ndim; ++i) {
      // A dim may be 0 (an empty field: no boxes in this image).
      bounded = d.shape.dims[i] == 0 || elements <= kMaxRecordElements / d.shape.dims[i];
      if (bounded) elements *= d.shape.dims[i];
      if (within_max) bounded = bounded && d.shape.dims[i] <= spec.max_dims[i];
    }
    if (!bounded || !spec.Admits(d.dtype, d.shape, d.codec))
      return Status::InvalidArgument(
          "record " + std::to_string(index) + ", field '" + spec.name + "': " + DTypeName(d.dtype) +
          " " + d.shape.ToString() +
          (d.codec != Codec::kRaw ? std::string(" ") + CodecName(d.codec) : std::string()) +
          " does not fit its declaration " + DTypeName(spec.dtype) + " " + spec.ShapeText() +
          (spec.codec != Codec::kRaw ? std::string(" ") + CodecName(spec.codec) : std::string()) +
          (within_max ? " within the sizes the cache records" : ""));
    if (d.codec != Codec::kRaw) {
      const Status s = CheckEncodedField(d.codec, d.dtype, d.shape, d.encoded_bytes);
      if (!s.ok())
        return Status::InvalidArgument("record " + std::to_string(index) + ", field '" +
                                       spec.name + "': " + s.message());
      elements = d.encoded_bytes;
    }
    if (d.data == nullptr && elements > 0)
      return Status::InvalidArgument("record " + std::to_string(index) + ", field '" + spec.name +
                                     "': no data");
  }
  return Status::OK();
}

bool IsMaskField(const FieldSpec& f, const FieldSpec& image) {
  const bool spatial = image.ndim == 3 && (f.ndim == 2 || (f.ndim == 3 && f.dims[0] > 0)) &&
                       f.dims[f.ndim - 2] == image.dims[1] && f.dims[f.ndim - 1] == image.dims[2];
  const bool integral =
      f.dtype == DType::kUint8 || f.dtype == DType::kInt32 || f.dtype == DType::kInt64;
  return f.name == kMaskFieldName && spatial && integral;
}

bool IsBoxesField(const FieldSpec& f) {
  return f.name == kBoxesFieldName && f.dtype == DType::kFloat32 && f.ndim == 2 && f.dims[1] == 4;
}

void SetFormat1Fields(Manifest* m) {
  FieldSpec image;
  image.name = "image";
  image.dtype = m->dtype;
  image.ndim = m->shape.ndim;
  for (int i = 0; i < image.ndim; ++i) image.dims[i] = image.max_dims[i] = m->shape.dims[i];
  FieldSpec label;
  label.name = "label";
  label.dtype = DType::kInt64;
  m->fields = {image, label};
  m->image_field = 0;
  m->label_field = 1;
}

Status CheckFieldSpecs(const std::vector<FieldSpec>& fields, const std::string& label_field,
                       const std::string& where, int* image_field, int* label_index) {
  if (fields.empty() || fields.size() > static_cast<size_t>(kMaxFields))
    return Status::InvalidArgument(where + ": a record needs 1.." + std::to_string(kMaxFields) +
                                   " fields, not " + std::to_string(fields.size()));
  std::set<std::string> names;
  *image_field = 0;
  *label_index = -1;
  for (size_t f = 0; f < fields.size(); ++f) {
    const FieldSpec& spec = fields[f];
    if (spec.name.empty() || !names.insert(spec.name).second)
      return Status::InvalidArgument(where + ": field name '" + spec.name +
                                     "' is empty or given twice");
    if (spec.ndim < 0 || spec.ndim > kMaxDims)
      return Status::InvalidArgument(where + ": field '" + spec.name + "' has " +
                                     std::to_string(spec.ndim) + " dims, at most " +
                                     std::to_string(kMaxDims));
    uint64_t elements = 1;
    for (int i = 0; i < spec.ndim; ++i) {
      const int64_t d = spec.dims[i];
      if (d == FieldSpec::kVariableDim) continue;
      if (d < 1 || d > UINT32_MAX || elements > kMaxRecordElements / static_cast<uint64_t>(d))
        return Status::InvalidArgument(where + ": field '" + spec.name + "' has a bad shape " +
                                       spec.ShapeText());
      elements *= static_cast<uint64_t>(d);
    }
    if (spec.codec != Codec::kRaw &&
        (spec.dtype != DType::kUint8 || spec.ndim != 3 || (spec.dims[0] != 1 && spec.dims[0] != 3)))
      return Status::InvalidArgument(where + ": field '" + spec.name + "' is " +
                                     CodecName(spec.codec) + ": it must be uint8 of 1 or 3 x H x W" +
                                     " (channels fixed), not " + DTypeName(spec.dtype) + " " +
                                     spec.ShapeText());
    if (spec.name == "image") *image_field = static_cast<int>(f);
    if (!label_field.empty() && spec.name == label_field) *label_index = static_cast<int>(f);
  }
  if (!label_field.empty()) {
    if (*label_index < 0)
      return Status::InvalidArgument(where + ": label field '" + label_field +
                                     "' is not one of the fields");
    const FieldSpec& l = fields[*label_index];
    if (l.ndim != 0 || (l.dtype != DType::kInt64 && l.dtype != DType::kInt32))
      return Status::InvalidArgument(where + ": label field '" + label_field +
                                     "' must be an int64 or int32 scalar, not " +
                                     DTypeName(l.dtype) + " " + l.ShapeText());
  }
  return Status::OK();
}

std::vector<std::string> PreprocessingDifferences(const Manifest& a, const Manifest& b) {
  std::vector<std::string> out;
  if (a.dtype != b.dtype)
    out.push_back(std::string("dtype: ") + DTypeName(a.dtype) + " vs " + DTypeName(b.dtype));
  auto shape_text = [](const Shape& s) {
    json dims = json::array();
    for (int i = 0; i < s.ndim; ++i) dims.push_back(s.dims[i]);
    return dims.dump();
  };
  if (shape_text(a.shape) != shape_text(b.shape))
    out.push_back("record shape: " + shape_text(a.shape) + " vs " + shape_text(b.shape));
  auto fields_text = [](const Manifest& m) {
    std::string t;
    for (const FieldSpec& f : m.fields)
      t += (t.empty() ? "" : ", ") + f.name + " " + DTypeName(f.dtype) + " " + f.ShapeText();
    return t;
  };
  if ((a.format_version == kFormatVersion2 || b.format_version == kFormatVersion2) &&
      fields_text(a) != fields_text(b))
    out.push_back("fields: " + fields_text(a) + " vs " + fields_text(b));
  for (std::string& d : TensorRecipeDifferences(a.preprocessing, b.preprocessing))
    out.push_back(std::move(d));
  return out;
}

}  // namespace kiln
