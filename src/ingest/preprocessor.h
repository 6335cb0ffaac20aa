// Preprocessor (internal): one source file -> one record's bytes, from a
// typed recipe. Serves the build pipeline, --repair and verify --level deep
// alike, so that all three make a record the same way.
//
// Thread-safety: a Preprocessor is immutable; Process may run on many
// threads at once, each with its own Scratch.
#ifndef KILN_SRC_INGEST_PREPROCESSOR_H_
#define KILN_SRC_INGEST_PREPROCESSOR_H_

#include <tbb/task_arena.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/image/decode.h"
#include "kiln/image/transform.h"
#include "kiln/ingest/build.h"
#include "kiln/preprocessing.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln::ingest {

class Preprocessor {
 public:
  // Buffers of one thread, reused from file to file.
  struct Scratch {
    std::vector<uint8_t> bytes;
    image::ImageU8 decoded, resized;
    image::ImageU8 mask;  // a decoded mask (--masks)
  };

  // `recipe` gives geometry, channels, dtype, max_pixels and (for
  // Process) mean/std; `shape` is the records' CHW shape.
  Preprocessor(const Preprocessing& recipe, const Shape& shape);
  Preprocessor() = default;  // an empty one, to be assigned

  // For re-checks of a finished cache: the manifest's recipe must be one
  // kiln build wrote (Corruption otherwise, saying so).
  static Status FromManifestRecipe(const Preprocessing& recipe, const Shape& shape,
                                   Preprocessor* out);

  // The records' shape: C x H x W, or, for whole images (the recipe's
  // `whole`: each record at its own size, a format 2 cache), C x 0 x 0.
  const Shape& shape() const { return shape_; }
  bool whole() const { return recipe_.whole; }
  DType recipe_dtype() const { return recipe_.dtype; }
  // Bytes of a record; 0 for whole images (each has its own).
  uint64_t record_bytes() const { return record_bytes_; }

  // Reads ROOT/item.rel_path, decodes, resizes and crops it into
  // scratch->resized (HWC, uint8), checking the size against shape()
  // (except for whole images).
  // Returns the reason a file cannot be a record.
  Status Resize(const std::string& root, const SourceItem& item, Scratch* scratch) const;
  // Resize, then writes the record payload (CHW, dtype, normalized with
  // the recipe's mean/std) into dst (record_bytes()).
  Status Process(const std::string& root, const SourceItem& item, Scratch* scratch,
                 void* dst) const;
  // Process, with an exception from below (std::bad_alloc from a codec,
  // say) turned into an IOError: the environment failed, not the file, so
  // the reject can be retried (journal.h, Retryable).
  Status TryProcess(const std::string& root, const SourceItem& item, Scratch* scratch,
                    void* dst) const;
  // For whole images: Resize, then the payload (CHW, dtype, normalized) into
  // *dst, resized to fit, and its shape (C x H x W) into *shape; exceptions
  // from below as TryProcess turns them. With the recipe's `encode` and a
  // `codec`: *dst may instead hold the image as a JPEG - the source file's
  // own bytes where it is a JPEG of the records' channels that needed no
  // resize, else the pixels encoded - and *codec says which (kRaw where
  // "auto" kept the pixels).
  Status TryProcessWhole(const std::string& root, const SourceItem& item, Scratch* scratch,
                         std::vector<uint8_t>* dst, Shape* shape, Codec* codec = nullptr) const;
  // The codec the image field may be stored in (kJpeg with --encode).
  Codec codec() const { return recipe_.encode.empty() ? Codec::kRaw : Codec::kJpeg; }

  // Whether records carry a mask (the recipe's `masks`, kiln build --masks).
  bool masks() const { return !recipe_.masks.empty(); }
  // After Resize of `item` (scratch holds its decoded image): its mask -
  // MASKS/<rel_path with the extension .png>, one 8-bit channel of the
  // image's source size - resized with nearest neighbour on the image's
  // geometry (image::ResizeAndCropNearest) into *dst, its shape (H x W)
  // into *shape. Returns the reason the mask cannot be used (naming it);
  // exceptions from below as TryProcess turns them.
  Status TryProcessMask(const SourceItem& item, Scratch* scratch, std::vector<uint8_t>* dst,
                        Shape* shape) const;

  // The record shape for `recipe`: fixed by crop or size; C x 0 x 0 for
  // whole images; otherwise that of the first image of `src` that decodes.
  // InvalidArgument when none does.
  static Status PlanShape(const Preprocessing& recipe, const SourceList& src, Shape* out);

  // Exact per-channel mean and std (in [0, 1] units) of the resized pixels
  // of the items `pick` of `src`: integer sums, so the result does not
  // depend on the thread count. Images that cannot be used are left out;
  // *unreadable (when given) counts those left out for a cause outside the
  // file (an IOError: the next build tries them again). InvalidArgument
  // when no image is readable.
  Status MeasureStats(const SourceList& src, const std::vector<size_t>& pick, int threads,
                      std::vector<double>* mean, std::vector<double>* std,
                      uint64_t* unreadable = nullptr) const;

 private:
  Preprocessing recipe_;
  image::ResizeSpec spec_;
  Shape shape_;
  uint64_t record_bytes_ = 0;
  std::vector<float> mean_, std_;
};

// Runs f in a task arena of `threads` threads (0: TBB's default, all cores).
template <typename F>
void InArena(int threads, F&& f) {
  if (threads > 0) {
    tbb::task_arena arena(threads);
    arena.execute(f);
  } else {
    f();
  }
}

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_PREPROCESSOR_H_
