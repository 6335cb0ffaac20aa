// The manifest as JSON: ManifestToJson / ManifestFromJson, and reading and
// writing DIR/manifest.json (format.md describes every key).
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>

#include <xxhash.h>

#include "core/file.h"
#include "core/json_read.h"
#include "kiln/cache_layout.h"
#include "kiln/manifest.h"

namespace kiln {

using nlohmann::json;

namespace {
// XXH3-64 of {"classes": ..., "preprocessing": ...} as compact JSON (keys
// sorted): what the loader takes from the manifest besides the shards -
// class names and, for uint8 caches, mean/std - so that an edit shows.
std::string MetaDigest(const json& classes, const json& preprocessing) {
  const std::string text = json{{"classes", classes}, {"preprocessing", preprocessing}}.dump();
  return DigestHex(XXH3_64bits(text.data(), text.size()));
}
}  // namespace

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
  for (const ShardInfo& s : m.shards) keyed = keyed || s.linked() || s.values != 0;
  keyed = keyed || m.pack_bytes != 0;
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
    if (!s.label_map.empty()) js["label_map"] = s.label_map;
    if (s.values != 0) js["values"] = s.values;
    shards.push_back(js);
  }
  j["shards"] = shards;
  if (m.commit_records > 0)
    j["layout"] = {{"initial_map_size", m.initial_map_size}, {"commit_records", m.commit_records}};
  else if (m.commit_bytes > 0)
    j["layout"] = {{"initial_map_size", m.initial_map_size}, {"commit_bytes", m.commit_bytes}};
  if (m.pack_bytes > 0 && j.contains("layout")) j["layout"]["pack_bytes"] = m.pack_bytes;
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
      if (layout.contains("pack_bytes")) {
        if (!keyed || m.format_version != kFormatVersion2)
          return Status::Corruption(where + ": layout.pack_bytes (packs of records) in a manifest "
                                            "that is not format 3 of version 2 records");
        KILN_RETURN_IF_ERROR(JsonInteger(layout.at("pack_bytes"), where, "layout.pack_bytes",
                                         &m.pack_bytes, uint64_t{1}));
      }
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
      if (s.contains("values")) {
        // A shard of packs: its LMDB entries (at least one a record's pack).
        if (!keyed || m.format_version != kFormatVersion2)
          return Status::Corruption(where + ": shard " + si.file +
                                    " has values (packs of records) in a manifest that is not "
                                    "format 3 of version 2 records");
        KILN_RETURN_IF_ERROR(JsonInteger(s.at("values"), where, field + "values", &si.values,
                                         si.count ? uint64_t{1} : uint64_t{0}, si.count));
      }
      if (s.contains("label_map")) {
        const std::string named = where + ": shard " + si.file + "'s label_map";
        if (!keyed)
          return Status::Corruption(named + " is in a format " + std::to_string(m.format_version) +
                                    " manifest");
        const bool labelled = m.format_version == kFormatVersion || m.label_field >= 0;
        if (!labelled || m.classes.empty())
          return Status::Corruption(named + " maps labels of a cache without " +
                                    (labelled ? "classes" : "a label field"));
        const json& map = s.at("label_map");
        if (!map.is_array() || map.empty())
          return Status::Corruption(named + " is not a non-empty list");
        for (size_t l = 0; l < map.size(); ++l) {
          int64_t to = -1;  // a class of this cache
          KILN_RETURN_IF_ERROR(JsonInteger(map[l], where,
                                           field + "label_map[" + std::to_string(l) + "]", &to,
                                           int64_t{0},
                                           static_cast<int64_t>(m.classes.size()) - 1));
          si.label_map.push_back(to);
        }
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

}  // namespace kiln
