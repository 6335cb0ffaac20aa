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

Status ResolveRecord(const Manifest& m, uint64_t index, const uint8_t* head, size_t head_len,
                     const uint8_t* mid, size_t mid_len, const uint8_t* tail, RecordHeader* h) {
  auto name = [index] { return "record " + std::to_string(index); };
  const bool v2 = m.format_version == kFormatVersion2;
  if (h->version != (v2 ? kRecordVersion2 : kRecordVersion))
    return Status::Corruption(name() + " is a version " + std::to_string(h->version) +
                              " record in a format " + std::to_string(m.format_version) + " cache");
  if (!v2) return CheckRecordAgainstManifest(m, index, *h);
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

namespace {
// XXH3-64 of {"classes": ..., "preprocessing": ...} as compact JSON (keys
// sorted): what the loader takes from the manifest besides the shards -
// class names and, for uint8 caches, mean/std - so that an edit shows.
std::string MetaDigest(const json& classes, const json& preprocessing) {
  const std::string text = json{{"classes", classes}, {"preprocessing", preprocessing}}.dump();
  return DigestHex(XXH3_64bits(text.data(), text.size()));
}
}  // namespace

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

namespace {
// The "fields" and "label_field" of a format 2 manifest.
Status FieldsFromJson(const json& j, const std::string& where, Manifest* m) {
  const json& fields = j.at("fields");
  if (!fields.is_array()) return Status::Corruption(where + ": \"fields\" is not a list");
  if (fields.size() > static_cast<size_t>(kMaxFields))
    return Status::Corruption(where + ": " + std::to_string(fields.size()) + " fields, at most " +
                              std::to_string(kMaxFields));
  for (size_t f = 0; f < fields.size(); ++f) {
    const json& jf = fields[f];
    const std::string at = "fields[" + std::to_string(f) + "]";
    FieldSpec spec;
    spec.name = jf.at("name").get<std::string>();
    KILN_RETURN_IF_ERROR(
        ParseDType(jf.at("dtype").get<std::string>(), &spec.dtype).WithContext(where + ": " + at));
    const json& shape = jf.at("shape");
    if (!shape.is_array() || shape.size() > static_cast<size_t>(kMaxDims))
      return Status::Corruption(where + ": " + at + ".shape must be a list of at most " +
                                std::to_string(kMaxDims) + " dims");
    spec.ndim = static_cast<int>(shape.size());
    const json max_shape = jf.value("max_shape", json::array());
    for (int i = 0; i < spec.ndim; ++i) {
      if (shape[i].is_null()) {
        spec.dims[i] = FieldSpec::kVariableDim;
      } else {
        uint32_t d = 0;
        KILN_RETURN_IF_ERROR(JsonInteger(shape[i], where, at + ".shape[" + std::to_string(i) + "]",
                                         &d, uint32_t{1}));
        spec.dims[i] = d;
      }
      if (static_cast<size_t>(i) < max_shape.size())
        KILN_RETURN_IF_ERROR(JsonInteger(
            max_shape[i], where, at + ".max_shape[" + std::to_string(i) + "]", &spec.max_dims[i]));
    }
    if (jf.contains("codec")) {
      const std::string codec = jf.at("codec").get<std::string>();
      if (codec == CodecName(Codec::kJpeg)) {
        spec.codec = Codec::kJpeg;
      } else if (codec != CodecName(Codec::kRaw)) {
        return Status::Corruption(where + ": " + at + ".codec '" + codec +
                                  "' is unknown (this kiln reads \"jpeg\"; a newer kiln wrote it?)");
      }
    }
    m->fields.push_back(spec);
  }
  const std::string label = j.value("label_field", std::string());
  Status st = CheckFieldSpecs(m->fields, label, where, &m->image_field, &m->label_field);
  if (!st.ok()) return Status::Corruption(st.message());
  const FieldSpec& image = m->fields[m->image_field];
  m->dtype = image.dtype;
  m->shape = image.fixed() ? image.FixedShape() : Shape{};
  return Status::OK();
}
}  // namespace

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["format"] = "kiln-cache";
  // A cache with shards under other keys (kiln merge --from) is format 3:
  // a kiln that predates keyed shards refuses it instead of reading the
  // wrong records. "record_format" says how its records are laid out.
  bool keyed = false;
  for (const ShardInfo& s : m.shards) keyed = keyed || s.keyed;
  j["format_version"] = keyed ? kFormatVersionKeyed : m.format_version;
  if (keyed) j["record_format"] = m.format_version;
  j["kiln_version"] = m.kiln_version;
  j["count"] = m.count;
  if (m.format_version == kFormatVersion2) {
    json fields = json::array();
    for (const FieldSpec& f : m.fields) {
      json shape = json::array(), max_shape = json::array();
      for (int i = 0; i < f.ndim; ++i) {
        shape.push_back(f.dims[i] == FieldSpec::kVariableDim ? json(nullptr) : json(f.dims[i]));
        max_shape.push_back(f.max_dims[i]);
      }
      json jf = {{"name", f.name},
                 {"dtype", DTypeName(f.dtype)},
                 {"shape", shape},
                 {"max_shape", max_shape}};
      if (f.codec != Codec::kRaw) jf["codec"] = CodecName(f.codec);
      fields.push_back(jf);
    }
    j["fields"] = fields;
    if (m.label_field >= 0) j["label_field"] = m.fields[m.label_field].name;
  } else {
    std::vector<uint32_t> dims(m.shape.dims.begin(), m.shape.dims.begin() + m.shape.ndim);
    j["sample"] = {{"dtype", DTypeName(m.dtype)}, {"shape", dims}};
  }
  j["classes"] = m.classes;
  json shards = json::array();
  for (const ShardInfo& s : m.shards) {
    json js = {{"file", s.file}, {"first", s.first}, {"count", s.count},
               {"bytes", s.bytes}, {"digest", s.digest}};
    if (s.keyed) js["key_first"] = s.key_first;
    shards.push_back(js);
  }
  j["shards"] = shards;
  if (m.commit_records > 0)
    j["layout"] = {{"initial_map_size", m.initial_map_size}, {"commit_records", m.commit_records}};
  else if (m.commit_bytes > 0)
    j["layout"] = {{"initial_map_size", m.initial_map_size}, {"commit_bytes", m.commit_bytes}};
  if (m.is_part())
    j["part"] = {{"index", m.part_index}, {"of", m.part_count}, {"first", m.first_index}};
  if (!m.appends.empty()) {
    json appends = json::array();
    for (const AppendEntry& a : m.appends)
      appends.push_back({{"count_before", a.count_before}, {"count_after", a.count_after},
                         {"time", a.time}, {"from", a.from}});
    j["appends"] = appends;
  }
  j["preprocessing"] = json::parse(m.preprocessing.ToJson());
  j["meta_digest"] = MetaDigest(j["classes"], j["preprocessing"]);
  return j.dump(2) + "\n";
}

Status ManifestFromJson(const std::string& text, const std::string& where, Manifest* out) {
  json j;
  const Status parsed = ParseJson(text, where, &j);
  if (!parsed.ok() || !j.is_object())
    return Status::Corruption((parsed.ok() ? where + ": not a JSON object" : parsed.message()) +
                              "; rebuild the cache with kiln build");
  // Every integer is read through JsonInteger (core/json_read.h), never
  // get<int>(): a float, a negative count or one out of range is a
  // Corruption naming the field.
  try {
    if (j.value("format", std::string()) != "kiln-cache")
      return Status::Corruption(where + ": \"format\" is not \"kiln-cache\"");
    Manifest m;
    KILN_RETURN_IF_ERROR(
        JsonInteger(j.at("format_version"), where, "format_version", &m.format_version));
    const bool keyed = m.format_version == kFormatVersionKeyed;
    if (keyed)
      KILN_RETURN_IF_ERROR(
          JsonInteger(j.at("record_format"), where, "record_format", &m.format_version));
    if (m.format_version != kFormatVersion && m.format_version != kFormatVersion2)
      return Status::Corruption(where + ": format version " + std::to_string(m.format_version) +
                                ", this kiln reads versions " + std::to_string(kFormatVersion) +
                                ", " + std::to_string(kFormatVersion2) + " and " +
                                std::to_string(kFormatVersionKeyed) + "; use a newer kiln");
    m.kiln_version = j.value("kiln_version", std::string());
    KILN_RETURN_IF_ERROR(JsonInteger(j.at("count"), where, "count", &m.count));
    if (m.format_version == kFormatVersion2) {
      KILN_RETURN_IF_ERROR(FieldsFromJson(j, where, &m));
    } else {
      const json& sample = j.at("sample");
      KILN_RETURN_IF_ERROR(
          ParseDType(sample.at("dtype").get<std::string>(), &m.dtype).WithContext(where));
      if (!IsPixelDType(m.dtype))
        return Status::Corruption(where + ": sample dtype " + DTypeName(m.dtype) +
                                  " in a format 1 cache (uint8, float16 or float32 only)");
      const json& dims = sample.at("shape");
      if (!dims.is_array() || dims.empty() || dims.size() > static_cast<size_t>(kMaxDims))
        return Status::Corruption(where + ": sample shape must have 1.." +
                                  std::to_string(kMaxDims) + " dims");
      m.shape.ndim = static_cast<int>(dims.size());
      uint64_t elements = 1;
      for (size_t i = 0; i < dims.size(); ++i) {
        uint32_t& d = m.shape.dims[i];
        KILN_RETURN_IF_ERROR(JsonInteger(dims[i], where, "sample.shape[" + std::to_string(i) + "]",
                                         &d, uint32_t{1}));
        // As DecodeRecordHeader bounds a record's shape: no overflow.
        if (elements > kMaxRecordElements / d)
          return Status::Corruption(where + ": sample shape " + dims.dump() + " holds over " +
                                    std::to_string(kMaxRecordElements) + " elements");
        elements *= d;
      }
      SetFormat1Fields(&m);
    }
    m.classes = j.value("classes", std::vector<std::string>());
    if (j.contains("layout")) {
      const json& layout = j.at("layout");
      KILN_RETURN_IF_ERROR(JsonInteger(layout.at("initial_map_size"), where,
                                       "layout.initial_map_size", &m.initial_map_size));
      if (layout.contains("commit_bytes"))
        KILN_RETURN_IF_ERROR(
            JsonInteger(layout.at("commit_bytes"), where, "layout.commit_bytes", &m.commit_bytes));
      else
        KILN_RETURN_IF_ERROR(JsonInteger(layout.at("commit_records"), where,
                                         "layout.commit_records", &m.commit_records));
    }
    if (j.contains("part")) {
      const json& part = j.at("part");
      KILN_RETURN_IF_ERROR(JsonInteger(part.at("index"), where, "part.index", &m.part_index));
      KILN_RETURN_IF_ERROR(JsonInteger(part.at("of"), where, "part.of", &m.part_count));
      KILN_RETURN_IF_ERROR(JsonInteger(part.at("first"), where, "part.first", &m.first_index));
      if (m.part_index < 0 || m.part_count < 1 || m.part_index >= m.part_count)
        return Status::Corruption(where + ": part " + std::to_string(m.part_index) + " of " +
                                  std::to_string(m.part_count) + " is not a valid part");
    }
    uint64_t next = m.first_index;
    std::set<std::string> files;
    const json& shards = j.at("shards");
    if (!shards.is_array()) return Status::Corruption(where + ": \"shards\" is not a list");
    for (size_t i = 0; i < shards.size(); ++i) {
      const json& s = shards[i];
      const std::string field = "shards[" + std::to_string(i) + "].";
      ShardInfo si;
      si.file = s.at("file").get<std::string>();
      KILN_RETURN_IF_ERROR(JsonInteger(s.at("first"), where, field + "first", &si.first));
      KILN_RETURN_IF_ERROR(JsonInteger(s.at("count"), where, field + "count", &si.count));
      KILN_RETURN_IF_ERROR(JsonInteger(s.at("bytes"), where, field + "bytes", &si.bytes));
      si.digest = s.at("digest").get<std::string>();
      if (s.contains("key_first")) {
        if (!keyed)
          return Status::Corruption(where + ": shard " + si.file +
                                    " has key_first in a format " +
                                    std::to_string(m.format_version) + " manifest");
        KILN_RETURN_IF_ERROR(
            JsonInteger(s.at("key_first"), where, field + "key_first", &si.key_first));
        if (si.count > UINT64_MAX - si.key_first)
          return Status::Corruption(where + ": shard " + si.file + "'s keys end past 2^64 - 1");
        si.keyed = true;
      }
      if (si.file.empty() || si.file.find('/') != std::string::npos || si.file[0] == '.' ||
          si.file.find('\0') != std::string::npos)
        return Status::Corruption(where + ": shard file name '" + si.file +
                                  "' must be a plain file name inside the cache");
      if (!files.insert(si.file).second)
        return Status::Corruption(where + ": shard file " + si.file + " is listed twice");
      if (si.first != next)
        return Status::Corruption(where + ": shard " + si.file + " starts at " +
                                  std::to_string(si.first) + ", expected " + std::to_string(next) +
                                  " (shards must be contiguous)");
      if (si.count > UINT64_MAX - next)
        return Status::Corruption(where + ": shard " + si.file + " ends past index 2^64 - 1");
      next += si.count;
      m.shards.push_back(std::move(si));
    }
    if (next - m.first_index != m.count)
      return Status::Corruption(where + ": shards hold " + std::to_string(next - m.first_index) +
                                " records but \"count\" says " + std::to_string(m.count));
    if (j.contains("appends")) {
      const json& appends = j.at("appends");
      if (!appends.is_array()) return Status::Corruption(where + ": \"appends\" is not a list");
      uint64_t before = 0;
      for (size_t i = 0; i < appends.size(); ++i) {
        const std::string field = "appends[" + std::to_string(i) + "].";
        AppendEntry a;
        KILN_RETURN_IF_ERROR(
            JsonInteger(appends[i].at("count_before"), where, field + "count_before", &a.count_before));
        KILN_RETURN_IF_ERROR(
            JsonInteger(appends[i].at("count_after"), where, field + "count_after", &a.count_after));
        a.time = appends[i].value("time", std::string());
        a.from = appends[i].value("from", std::string());
        if (a.count_before < before || a.count_after < a.count_before || a.count_after > m.count)
          return Status::Corruption(where + ": " + field + " records " +
                                    std::to_string(a.count_before) + ".." +
                                    std::to_string(a.count_after) +
                                    " do not follow the earlier appends within the " +
                                    std::to_string(m.count) + " records");
        before = a.count_after;
        m.appends.push_back(std::move(a));
      }
    }
    if (j.contains("preprocessing") && j["preprocessing"].is_object())
      KILN_RETURN_IF_ERROR(
          Preprocessing::FromJson(j["preprocessing"].dump(), where, &m.preprocessing));
    if (j.contains("meta_digest") &&  // absent in manifests of kiln before 2026-12
        j["meta_digest"].get<std::string>() !=
            MetaDigest(j.value("classes", json::array()), j.value("preprocessing", json::object())))
      return Status::Corruption(
          where + ": \"classes\" or \"preprocessing\" was changed after the build (meta_digest "
                  "does not match): the records were made with other labels or normalization; "
                  "restore the file or rebuild the cache (kiln build --force)");
    *out = std::move(m);
  } catch (const json::exception& e) {
    return Status::Corruption(where + ": missing or mistyped field (" + e.what() + ")");
  }
  return Status::OK();
}

Status ReadManifest(const std::string& dir, Manifest* out) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    return Status::NotFound(dir + ": no such cache directory");
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(dir + ": not a directory");
  const std::string path = dir + "/" + kManifestName;
  std::string text;
  Status s = ReadWholeFile(path, &text);
  if (s.IsNotFound())
    return Status::Incomplete(dir + ": incomplete cache (no " + std::string(kManifestName) +
                              "); the build did not finish - run the same kiln build again to "
                              "resume it");
  KILN_RETURN_IF_ERROR(s);
  return ManifestFromJson(text, path, out);
}

Status WriteManifest(const std::string& dir, const Manifest& m) {
  return WriteFileAtomic(dir, kManifestName, kManifestTempName, ManifestToJson(m));
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
