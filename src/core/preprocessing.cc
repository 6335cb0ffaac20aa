#include "kiln/preprocessing.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "core/json_read.h"

namespace kiln {

using nlohmann::json;

namespace {

constexpr const char* kNormNames[] = {"none", "imagenet", "auto", "explicit"};

// The fields kiln build records; a recipe with all of them is complete.
constexpr const char* kRecipeKeys[] = {
    "source",       "resize",       "crop",  "size",         "interpolation", "channels",
    "dtype",        "norm",         "mean",  "std",          "normalized",    "max_pixels",
    "shuffle_seed", "val_fraction", "split", "stats_sample", "libraries"};
// Known but optional: "part" (a part's own record).
bool IsKnownKey(const std::string& k) {
  if (k == "part" || k == "whole" || k == "max_side" || k == "masks" || k == "encode" ||
      k == "encode_quality")
    return true;
  for (const char* r : kRecipeKeys)
    if (k == r) return true;
  return false;
}

json ToJsonValue(const Preprocessing& p) {
  if (!p.complete) {
    json j = json::parse(p.recorded_json, nullptr, /*allow_exceptions=*/false);
    return j.is_object() ? j : json::object();
  }
  json j = json::object();
  j["source"] = {{"root", p.source.root},
                 {"layout", p.source.layout},
                 {"files", p.source.files},
                 {"digest", p.source.digest}};
  if (!p.source.list_file.empty()) j["source"]["list_file"] = p.source.list_file;
  if (p.source.unreadable > 0) j["source"]["unreadable"] = p.source.unreadable;
  if (!p.source.masks_digest.empty()) j["source"]["masks_digest"] = p.source.masks_digest;
  if (p.part_index >= 0) j["part"] = {{"index", p.part_index}, {"of", p.part_count}};
  j["resize"] = p.resize;
  j["crop"] = p.crop;
  j["size"] = {p.size_w, p.size_h};
  if (p.whole) j["whole"] = true;
  if (p.max_side > 0) j["max_side"] = p.max_side;
  if (!p.encode.empty()) {
    j["encode"] = p.encode;
    j["encode_quality"] = p.encode_quality;
  }
  if (!p.masks.empty()) j["masks"] = p.masks;
  j["interpolation"] = p.interpolation;
  j["channels"] = p.channels;
  j["dtype"] = DTypeName(p.dtype);
  j["norm"] = NormKindName(p.norm);
  j["mean"] = p.mean;
  j["std"] = p.std;
  j["normalized"] = p.normalized;
  j["max_pixels"] = p.max_pixels;
  j["shuffle_seed"] = p.shuffle_seed;
  j["val_fraction"] = p.val_fraction;
  j["split"] = p.split;
  j["stats_sample"] = p.stats_sample;
  j["libraries"] = json::object();
  for (const auto& [name, version] : p.libraries) j["libraries"][name] = version;
  for (const auto& [key, text] : p.extra) j[key] = json::parse(text, nullptr, false);
  return j;
}

}  // namespace

const char* NormKindName(NormKind kind) { return kNormNames[static_cast<int>(kind)]; }

Status ParseNormKind(const std::string& name, NormKind* out) {
  for (int i = 0; i < 4; ++i)
    if (name == kNormNames[i]) {
      *out = static_cast<NormKind>(i);
      return Status::OK();
    }
  return Status::InvalidArgument("norm '" + name + "': expected none, imagenet, auto or explicit");
}

std::string Preprocessing::ToJson() const { return ToJsonValue(*this).dump(); }

Status Preprocessing::FromJson(const std::string& text, const std::string& where,
                               Preprocessing* out) {
  json j;
  KILN_RETURN_IF_ERROR(ParseJson(text, where, &j));
  if (!j.is_object()) return Status::Corruption(where + ": \"preprocessing\" is not a JSON object");
  Preprocessing p;
  size_t recipe_keys = 0;
  for (const char* k : kRecipeKeys) recipe_keys += j.contains(k);
  p.complete = recipe_keys == std::size(kRecipeKeys);
  if (!p.complete) p.recorded_json = j.dump();
  const char* field = "";
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  try {
    auto get = [&](const char* key, auto* value) {
      field = key;
      if (j.contains(key)) j.at(key).get_to(*value);
    };
    // Integers through JsonInteger (core/json_read.h), in the ranges
    // kiln build checks its options against: never get<int>().
    auto integer = [&](const char* key, auto* value, auto lo, auto hi) {
      field = key;
      using T = std::remove_pointer_t<decltype(value)>;
      return j.contains(key) ? JsonInteger<T>(j.at(key), where, key, value, lo, hi) : Status::OK();
    };
    if (j.contains("source")) {
      field = "source";
      const json& s = j.at("source");
      p.source.root = s.at("root").get<std::string>();
      p.source.layout = s.at("layout").get<std::string>();
      KILN_RETURN_IF_ERROR(JsonInteger(s.at("files"), where, "source.files", &p.source.files));
      p.source.digest = s.at("digest").get<std::string>();
      p.source.list_file = s.value("list_file", std::string());
      p.source.masks_digest = s.value("masks_digest", std::string());
      if (s.contains("unreadable"))
        KILN_RETURN_IF_ERROR(
            JsonInteger(s.at("unreadable"), where, "source.unreadable", &p.source.unreadable));
    }
    if (j.contains("part")) {
      field = "part";
      const json& part = j.at("part");
      KILN_RETURN_IF_ERROR(JsonInteger(part.at("index"), where, "part.index", &p.part_index, 0));
      KILN_RETURN_IF_ERROR(JsonInteger(part.at("of"), where, "part.of", &p.part_count, 1));
    }
    KILN_RETURN_IF_ERROR(integer("resize", &p.resize, 0, kMaxInt));
    KILN_RETURN_IF_ERROR(integer("crop", &p.crop, 0, kMaxInt));
    if (j.contains("size")) {
      field = "size";
      const json& size = j.at("size");
      KILN_RETURN_IF_ERROR(JsonInteger(size.at(0), where, "size[0]", &p.size_w, 0));
      KILN_RETURN_IF_ERROR(JsonInteger(size.at(1), where, "size[1]", &p.size_h, 0));
    }
    get("whole", &p.whole);
    KILN_RETURN_IF_ERROR(integer("max_side", &p.max_side, 0, kMaxInt));
    get("masks", &p.masks);
    get("encode", &p.encode);
    if (!p.encode.empty() && p.encode != "jpeg" && p.encode != "auto")
      return Status::Corruption(where + ": encode '" + p.encode +
                                "' is unknown (this kiln writes \"jpeg\" and \"auto\")");
    KILN_RETURN_IF_ERROR(integer("encode_quality", &p.encode_quality, 0, 100));
    get("interpolation", &p.interpolation);
    KILN_RETURN_IF_ERROR(integer("channels", &p.channels, 1, 3));
    if (j.contains("dtype")) {
      field = "dtype";
      KILN_RETURN_IF_ERROR(
          ParseDType(j.at("dtype").get<std::string>(), &p.dtype).WithContext(where));
    }
    if (j.contains("norm")) {
      field = "norm";
      KILN_RETURN_IF_ERROR(
          ParseNormKind(j.at("norm").get<std::string>(), &p.norm).WithContext(where));
    }
    get("mean", &p.mean);
    get("std", &p.std);
    // Records are divided by std (a uint8 cache's reader does it): kiln
    // build refuses std <= 0, so the recipe cannot hold one.
    for (double s : p.std)
      if (!(s > 0))
        return Status::Corruption(where + ": preprocessing \"std\" holds " + std::to_string(s) +
                                  "; every value must be > 0");
    get("normalized", &p.normalized);
    KILN_RETURN_IF_ERROR(
        integer("max_pixels", &p.max_pixels, int64_t{1}, std::numeric_limits<int64_t>::max()));
    KILN_RETURN_IF_ERROR(integer("shuffle_seed", &p.shuffle_seed,  // < 0: no shuffle
                                 std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max()));
    get("val_fraction", &p.val_fraction);
    get("split", &p.split);
    KILN_RETURN_IF_ERROR(integer("stats_sample", &p.stats_sample, uint64_t{0},
                                 std::numeric_limits<uint64_t>::max()));
    get("libraries", &p.libraries);
  } catch (const json::exception& e) {
    return Status::Corruption(where + ": preprocessing field \"" + field +
                              "\" is missing a part or has the wrong type (" + e.what() + ")");
  }
  if (p.complete)
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!IsKnownKey(it.key())) p.extra[it.key()] = it.value().dump();
  *out = std::move(p);
  return Status::OK();
}

std::string RecipeChanges(const Preprocessing& from, const Preprocessing& to) {
  const json a = ToJsonValue(from), b = ToJsonValue(to);
  std::set<std::string> keys;
  for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
  for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
  std::string out;
  for (const auto& k : keys) {
    const json va = a.contains(k) ? a[k] : json(), vb = b.contains(k) ? b[k] : json();
    if (va != vb) out += (out.empty() ? "" : "; ") + k + ": " + va.dump() + " -> " + vb.dump();
  }
  return out;
}

std::vector<std::string> TensorRecipeDifferences(const Preprocessing& a, const Preprocessing& b) {
  const json pa = ToJsonValue(a), pb = ToJsonValue(b);
  std::vector<std::string> out;
  for (const char* key : {"channels", "resize", "crop", "size", "whole", "max_side", "encode",
                          "encode_quality", "interpolation", "normalized", "mean", "std"}) {
    const json va = pa.contains(key) ? pa[key] : json();
    const json vb = pb.contains(key) ? pb[key] : json();
    if (va != vb)
      out.push_back(std::string(key) + ": " + (va.is_null() ? "absent" : va.dump()) + " vs " +
                    (vb.is_null() ? "absent" : vb.dump()));
  }
  return out;
}

}  // namespace kiln
