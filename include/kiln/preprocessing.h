// Preprocessing: the typed recipe that made a cache's tensors, as recorded
// in the manifest's "preprocessing" object (docs/format.md).
//
// kiln build fills every field and sets `complete`: only then are the typed
// fields what ToJson writes. Caches written by other writers may record
// only some fields, or none ("{}", the default): FromJson fills the typed
// fields that are there, `complete` stays false, and ToJson gives back the
// recorded object unchanged, so that a rewritten manifest keeps its bytes.
// A writer that records a partial recipe passes its JSON through FromJson.
//
// This header is the one owner of the recipe's field names: the manifest,
// the builder, repair, deep verify, merge, the trainer's loader and
// `kiln inspect` all go through it.
#ifndef KILN_PREPROCESSING_H_
#define KILN_PREPROCESSING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln {

// How float records were normalized: (x/255 - mean) / std per channel.
enum class NormKind {
  kNone,      // mean 0, std 1
  kImagenet,  // torchvision's ImageNet statistics (3 channels)
  kAuto,      // statistics measured over the sources (or a seeded sample)
  kExplicit,  // --mean/--std given by the user
};
// "none", "imagenet", "auto", "explicit".
const char* NormKindName(NormKind kind);
// Parses a name written by NormKindName. InvalidArgument otherwise.
Status ParseNormKind(const std::string& name, NormKind* out);

// Where the records came from.
struct SourceRecipe {
  std::string root;       // absolute path of the source root
  std::string layout;     // "imagefolder", "list" or "csv"
  std::string list_file;  // absolute path of the list file; "" for an ImageFolder
  uint64_t files = 0;     // sources of the split, all parts together
  std::string digest;     // SourceDigest of the whole source list (16 hex digits)
  // With --masks: MasksDigest of the mask files (16 hex digits); recorded
  // only then ("masks_digest").
  std::string masks_digest;
  // Folders or files the build could not list or read for --norm auto's
  // statistics, for a cause outside them (permission denied, an I/O
  // error): the next build with the same arguments tries them again. 0 (and
  // not recorded) for a build that read its whole tree.
  uint64_t unreadable = 0;
};

// --encode auto keeps a record's JPEG when it takes at most this share of
// the raw pixels' bytes (it saves at least half), else stores the pixels.
inline constexpr double kEncodeAutoShare = 0.5;

struct Preprocessing {
  // True when every field below was recorded (kiln build's recipe).
  bool complete = false;
  SourceRecipe source;
  // A part's own record (kiln build --num-parts): index of count; kiln
  // merge drops it. part_index < 0 for an ordinary cache.
  int part_index = -1;
  int part_count = 0;
  int resize = 0;              // shorter side (torchvision Resize(S)); 0 = none
  int crop = 0;                // center crop C x C; 0 = none
  int size_w = 0, size_h = 0;  // squashed to W x H; 0 = none
  // Whole images (kiln build --max-side / --shorter-side, format 2): each
  // record holds its image at its own size, aspect kept; max_side bounds
  // the longer side (torchvision Resize(max_size=)), 0 = none. Recorded
  // only when set ("whole", "max_side"), so that other recipes read and
  // write as before.
  bool whole = false;
  int max_side = 0;
  // Whole images stored encoded (kiln build --encode): "jpeg" (every
  // record a JPEG of quality `encode_quality`, a source JPEG that needs no
  // resize kept as its own bytes) or "auto" (the same where the JPEG is at
  // most kEncodeAutoShare of the raw pixels' bytes, raw pixels elsewhere);
  // "" = raw. Recorded only when set ("encode", "encode_quality").
  std::string encode;
  int encode_quality = 0;
  // Segmentation masks (kiln build --masks DIR): the absolute directory
  // whose PNGs, at the images' relative paths, became each record's "mask"
  // field; "" = none. Recorded only when set.
  std::string masks;
  std::string interpolation = "bilinear, antialiased (PIL/torchvision)";
  int channels = 3;               // 1 or 3
  DType dtype = DType::kFloat16;  // of the records
  NormKind norm = NormKind::kNone;
  std::vector<double> mean, std;  // per channel, in [0, 1] pixel units
  bool normalized = true;         // false for uint8 records (raw pixels)
  int64_t max_pixels = 100'000'000;
  int64_t shuffle_seed = -1;                     // >= 0: records in a seeded permutation
  double val_fraction = 0;                       // > 0: split by path hash
  std::string split;                             // "", "train" or "val"
  uint64_t stats_sample = 0;                     // norm auto: images sampled; 0 = all
  std::map<std::string, std::string> libraries;  // name -> version (kiln, codecs)
  // Keys this kiln does not know, with their JSON text, kept as recorded.
  std::map<std::string, std::string> extra;
  // An incomplete recipe's recorded object (JSON text), written back as is.
  std::string recorded_json = "{}";

  // The "preprocessing" object as compact JSON text (keys sorted).
  std::string ToJson() const;
  // Parses a "preprocessing" object. Returns Corruption naming `where` for
  // text that is not an object or a known field of the wrong type.
  static Status FromJson(const std::string& text, const std::string& where, Preprocessing* out);

  // The same recipe: equal JSON forms.
  bool operator==(const Preprocessing& o) const { return ToJson() == o.ToJson(); }
  bool operator!=(const Preprocessing& o) const { return !(*this == o); }
};

// Every recorded field that differs, as "key: A -> B" in key order (JSON
// values; "null" when absent), joined by "; ". Empty when equal.
std::string RecipeChanges(const Preprocessing& from, const Preprocessing& to);

// What differs in the fields that shape the tensors a model sees: channels,
// resize, crop, size, interpolation, normalized, mean and std, each as a
// phrase such as "mean: [0.286] vs [0.5]" ("absent" when not recorded).
std::vector<std::string> TensorRecipeDifferences(const Preprocessing& a, const Preprocessing& b);

}  // namespace kiln

#endif  // KILN_PREPROCESSING_H_
