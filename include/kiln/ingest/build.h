// BuildCache: decode, resize and normalize a raw image dataset once into a
// kiln cache, with a oneTBB pipeline (serial reader of chunks -> parallel
// decode/resize/normalize into pooled buffers -> serial in-order writer).
//
// Memory is bounded by tokens x chunk x record size whatever the dataset.
// Output is deterministic: the same sources and options give byte-identical
// shards for any thread count. A build killed at any moment resumes from its
// last committed record when run again with the same options.
#ifndef KILN_INGEST_BUILD_H_
#define KILN_INGEST_BUILD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/duplicates.h"
#include "kiln/preprocessing.h"
#include "kiln/progress.h"
#include "kiln/record.h"
#include "kiln/status.h"
#include "kiln/verify.h"

namespace kiln::ingest {

// One input file. `rel_path` is relative to the source root, '/'-separated.
struct SourceItem {
  std::string rel_path;
  int64_t label = -1;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // A CSV with a "labels" column: the item's class indices, sorted, each
  // once (label is then -1); with float columns after it: their values.
  std::vector<int64_t> labels;
  std::vector<float> targets;
};

// What the listing could not use, and why.
struct SourceReject {
  std::string path;    // the absolute path (a list file's line itself when it names none)
  std::string reason;  // what was wrong, naming the list file's line where there is one
  // The cause lay in the environment (permission denied, an I/O error):
  // the next build lists it again.
  bool retry = false;
};

struct SourceList {
  std::string root;                  // absolute path of the source root
  std::string layout;                // "imagefolder", "list" or "csv"
  std::vector<std::string> classes;  // label i names classes[i]
  // A CSV "path,labels[,...]": several labels per item (SourceItem::labels).
  bool multi_label = false;
  // The names of a CSV's float columns after its label column, in order
  // (SourceItem::targets holds their values); empty without.
  std::vector<std::string> target_names;
  std::vector<SourceItem> items;     // sorted by rel_path
  // What the listing skipped, in a stable order: folders or files of an
  // ImageFolder tree that could not be read, symbolic link loops; lines of
  // a list file or CSV that name no usable file - a path outside the root,
  // a missing file, a bad label, a line that does not parse. kiln build
  // logs them in rejects.tsv like undecodable images (and --strict fails
  // on the first).
  std::vector<SourceReject> rejected;
  // How many of `rejected` can be retried.
  uint64_t retryable() const;
};

// ImageFolder: ROOT/<class>/<file>; classes sorted by name, exactly as
// torchvision's ImageFolder, so labels agree with PyTorch. Only files with
// an image extension are listed (torchvision's IMG_EXTENSIONS + .webp/.tif),
// below each class folder at any depth, through symbolic links (a link
// keeps its own path and class). Never stops for one bad part of the tree:
// a folder or file that cannot be read, a symbolic link loop (a link to a
// folder it lies in) or a link that leads nowhere goes to out->rejected
// and the rest is listed. The folder `skip` (the cache being built, when
// it lies inside ROOT; "" for none) is not listed. An empty class folder
// (with nothing rejected in it) is an InvalidArgument naming it.
Status ListImageFolder(const std::string& root, SourceList* out, const std::string& skip = "");
// A list file of "relative/path label" lines (Caffe's convert_imageset), or
// a CSV with a header "path,label" (label a class name or an index): chosen
// by the ".csv" extension. A CSV header "path,labels" gives several labels
// per image, separated by ';' (names or indices, as for one; an empty field:
// none); more columns after the label column, "path,label,age,score", are
// float targets (each line's values must parse as finite numbers). Paths are relative to `root`. A
// line that does not parse, a path outside root, a missing file or a bad numeric label goes to
// out->rejected; a missing list, a bad CSV header, a path listed twice or no usable line at all is
// an InvalidArgument naming the file.
Status ReadSourceList(const std::string& root, const std::string& list_path, SourceList* out);

// ListImageFolder(root, skip) when `list_file` is empty, else
// ReadSourceList.
Status ListSources(const std::string& root, const std::string& list_file, SourceList* out,
                   const std::string& skip = "");

// The item of `list` at `rel_path` (items are sorted by it), or nullptr.
const SourceItem* FindSource(const SourceList& list, const std::string& rel_path);

// XXH3 digest (hex) of the sorted (path, label, size, mtime) list.
std::string SourceDigest(const SourceList& list);

// The mask of the source `rel_path` (kiln build --masks DIR): its path
// below DIR, the same relative path with the extension .png.
std::string MaskRelPath(const std::string& rel_path);
// XXH3 digest (hex) of the mask files of `list`'s items under `masks_dir`:
// each one's (path, size, mtime), or that it is missing, in the list's
// order. A mask added, removed or changed changes it.
std::string MasksDigest(const SourceList& list, const std::string& masks_dir);

struct BuildOptions {
  std::string src;                   // source root directory
  std::string out;                   // cache directory (OUT/train, OUT/val with val_fraction)
  std::string list_file;             // "" = ImageFolder layout under src
  int resize = 0;                    // shorter side -> resize (torchvision Resize(S)); 0 = none
  int crop = 0;                      // center crop C x C; 0 = none
  // Whole images, a format 2 cache: each record holds its image at its own
  // size, aspect kept. max_side bounds the longer side (FFCV's
  // max_resolution, torchvision Resize(max_size=)); shorter_side resizes
  // the shorter side to S (torchvision Resize(S), so that a load-time
  // CenterCrop is exactly torchvision's evaluation transform). Either or
  // both (max_side > shorter_side); they exclude crop and size.
  int max_side = 0;
  int shorter_side = 0;
  // Whole images stored encoded (needs max_side or shorter_side, uint8):
  // "jpeg" (each record a JPEG of `encode_quality`; a source JPEG that needs
  // no resize and has the records' channels is stored as its own bytes),
  // "auto" (the same, raw pixels where the JPEG would not save at least
  // half: kEncodeAutoShare), "" = raw pixels.
  std::string encode;
  int encode_quality = 90;
  // Segmentation masks: a directory of single-channel 8-bit PNGs (class
  // indices) at each image's relative path with the extension .png, each
  // resized with nearest neighbour on its image's geometry and stored as the
  // record's "mask" field (a format 2 cache). "" = none.
  std::string masks;
  int size_w = 0, size_h = 0;        // squash to W x H instead; 0 = none
  int channels = 3;                  // 1 or 3
  // float16/float32: normalized; uint8: raw pixels. Unset: RecordDType's
  // default (uint8 for whole images, float16 otherwise).
  std::optional<DType> dtype;
  NormKind norm = NormKind::kNone;   // none (mean 0, std 1), imagenet, auto, or explicit
  std::vector<double> mean, std;     // explicit per-channel values (norm = kExplicit)
  uint64_t stats_sample = 0;         // norm auto: seeded sample of N images; 0 = all
  double val_fraction = 0;           // > 0: OUT/train and OUT/val split by path hash
  int64_t shuffle_seed = -1;         // >= 0: write a seeded permutation of the records
  uint64_t shard_size = 4ull << 30;  // record bytes per shard
  int threads = 0;                   // 0 = all cores
  int64_t max_pixels = 100'000'000;  // reject headers claiming more pixels
  bool strict = false;               // any rejected input fails the build (exit 1)
  bool force = false;                // rebuild from scratch, even an up-to-date cache
  // Rebuild a cache (or an unfinished build) whose sources or options
  // changed, and keep an up-to-date one; without it (and without force) a
  // changed cache is a Stale error that leaves it as it is.
  bool rebuild_if_changed = false;
  bool repair = false;  // rewrite only the records verify finds bad, from their sources
  // Add the sources the finished cache in OUT does not hold (files added to
  // SRC) as records after its last, in new shards, with the same recipe;
  // a source the cache holds that changed or is gone is refused (rebuild).
  bool append = false;
  int num_parts = 1;    // > 1: build only part `part` (0-based) of num_parts,
  int part = 0;         //   into OUT/part-IIIII-of-NNNNN (per split); see MergeParts
};

// The records' dtype of a build: o.dtype where given, else uint8 for whole
// images (max_side or shorter_side: such a cache exists to be cropped and
// resampled at load time, RandomResizedCrop or Resize + CenterCrop, which
// read uint8 pixels) and float16 for fixed-size records.
DType RecordDType(const BuildOptions& o);

struct BuildResult {
  uint64_t written = 0;
  uint64_t rejected = 0;
  uint64_t bytes = 0;  // record bytes written by this run
  double seconds = 0;
  bool up_to_date = false;          // nothing to do
  bool resumed = false;             // continued an interrupted build
  std::vector<std::string> caches;  // directories written
  std::string first_reject;         // "path: reason"
  // Rejected inputs whose cause lay in the environment, not in the file
  // (permission denied, an I/O error, no descriptor or memory left; marked
  // "yes" in rejects.tsv's retry column): the next build with the same
  // arguments tries them again, and rebuilds when one comes out otherwise.
  // On an up-to-date cache: those that were tried again and still fail.
  uint64_t retryable = 0;
  // Records with the same pixels as another, and val records also in train,
  // over every cache of OUT; duplicates_file is OUT/duplicates.tsv when this
  // run wrote it ("" for a repair, a part, or an up-to-date OUT).
  DuplicateCounts duplicates;
  std::string duplicates_file;
};

// Called from the writer thread; may print.
// Progress: sources done of the split's, record bytes written.
using ProgressFn = std::function<void(const std::string& cache, const Progress&)>;
using InfoFn = std::function<void(const std::string& line)>;

struct MergeResult {
  std::vector<std::string> caches;  // directories written
  uint64_t records = 0;
  int parts = 0;  // parts joined (MergeCaches: caches joined)
  uint64_t shards = 0;
  // Rewritten, not linked: a part after one that rejected inputs.
  uint64_t copied_records = 0;
  // MergeCaches: records linked from a cache whose classes are numbered
  // otherwise, read with their labels mapped (ShardInfo::label_map).
  uint64_t relabelled_records = 0;
  DuplicateCounts duplicates;   // over the merged caches (OUT/duplicates.tsv)
  std::string duplicates_file;
  double seconds = 0;  // the whole merge, the duplicate report included
};

// kiln merge: joins the parts of a cache built with --num-parts N into one
// cache in OUT, record for record what a one-part build writes. Shards are
// hard-linked, not copied (copied only across file systems), except the
// records of parts after one that rejected inputs: those need new indices
// and are rewritten. sources.tsv and rejects.tsv are joined; the manifest
// is written last, then OUT/duplicates.tsv. `parts` empty: the parts found in OUT (and in OUT/train
// and OUT/val for a --val-fraction build). Parts are removed afterwards
// unless keep_parts. Errors name the missing, incomplete or mismatched part.
Status MergeParts(const std::string& out, const std::vector<std::string>& parts, bool keep_parts,
                  const std::function<void(const std::string&)>& info, MergeResult* result);

// kiln merge --from A --from B OUT: one cache in OUT (new, or left by an
// interrupted merge) of the records of the finished caches `from`, in that
// order: A's records keep their indices, B's follow. Refused, saying what
// differs, unless every cache has the same fields (names, dtypes, shapes,
// codecs, label field) and the same tensor recipe (PreprocessingDifferences,
// the split, both kiln build's or both another writer's). Classes are
// matched by name: A's in order, then each later cache's new names; labels
// are mapped to them. A's shards are hard-linked (copied across file
// systems); a later cache's records are written again under their new
// indices (an LMDB key and a checksum seed are a record's index), with
// mapped labels. The manifest (written last, then OUT/duplicates.tsv) has
// A's recipe with "merged" naming where each later cache came from and an
// `appends` entry per later cache; OUT gets no sources.tsv. The inputs are
// left as they were.
Status MergeCaches(const std::string& out, const std::vector<std::string>& from,
                   const std::function<void(const std::string&)>& info, MergeResult* result);

// Builds (or resumes, or confirms up to date) the cache(s) described by
// `options`, then finds duplicate records and train/val overlap over them
// (OUT/duplicates.tsv). A cache whose build could not read some inputs for
// a cause outside them (BuildResult::retryable) is rebuilt by the next call
// as soon as one of them reads otherwise. Returns InvalidArgument for bad
// options or layouts (OUT being SRC itself, say), Stale when OUT holds a
// cache made from other sources/options (unless force or
// rebuild_if_changed), Corruption under strict when an input is rejected
// (naming the first), IOError.
Status BuildCache(const BuildOptions& options, const ProgressFn& progress, const InfoFn& info,
                  BuildResult* result);

// The checks of a cache against its sources, above core's levels.
enum class SourceCheck {
  kSources,  // list the sources again and compare with sources.tsv
  kDeep,     // and preprocess a sample of records again, byte for byte
};
// "sources", "deep".
const char* SourceCheckName(SourceCheck check);
// Parses a name written by SourceCheckName; InvalidArgument otherwise.
Status ParseSourceCheck(const std::string& name, SourceCheck* out);

// Verifies the cache in DIR like VerifyCache at level full (options' other
// fields apply) and then, for kSources, lists the sources again (from the
// manifest's recorded root and layout) and compares them with sources.tsv:
// files added, removed or changed are problems (the cache is stale). For
// kDeep also `sample` records chosen with `seed` (0 = all) are preprocessed
// again with the recorded recipe and compared byte for byte. Record-level
// problems get their source path; report->level is the check's name.
Status VerifyWithSources(const std::string& dir, const VerifyOptions& options, SourceCheck check,
                         uint64_t sample, uint64_t seed, VerifyReport* report);

}  // namespace kiln::ingest

#endif  // KILN_INGEST_BUILD_H_
