// Loader: fills caller-owned batch slots from a cache with worker threads,
// while the consumer works on earlier batches.
//
// One copy: each record's payload goes from the cache straight into its
// place in a slot - copied out of the LMDB memory map when the epoch's
// records are in the page cache, read with preadv when they are not (see
// Read-ahead) - with the optional crop/flip fused into that copy (a cold
// record with a crop is read whole into the worker's buffer first); labels
// go into the slot's label array. Nothing is allocated per sample, and the
// dataset is never copied into anonymous memory. The slots are the caller's:
// kiln.Loader's host tensors view them; a device (or a dtype conversion)
// costs the copy to it, from the slot.
//
// Order: per epoch a seeded permutation - kiln's one shuffle
// (kiln/shuffle.h), seeded from `seed` and the epoch: the same on every
// machine and for every worker count - or sequential order; rank r of W
// takes every W-th index of the (wrap-around padded) permutation as PyTorch's
// DistributedSampler does, so every rank gets the same number of batches.
//
// Protocol: StartEpoch(e, b) -> Next() ... Release(slot) ... until Next()
// says the epoch ended. A slot returned by Next() is not refilled until it
// is released. Batch b always lands in slot b % slots.size(), so at most
// slots.size() batches can be held at once.
//
// Read-ahead: a cache that is not in the page cache (the first epoch after a
// copy, a cache larger than memory) would be read a page at a time, as the
// workers fault on each record. A read-ahead thread walks the epoch's order
// ahead of the workers and asks the kernel for each upcoming record's bytes
// (madvise WILLNEED: the disk reads them while the workers copy others),
// keeping at most `readahead_bytes` requested but not yet copied. An epoch
// whose records are already in memory (judged from a sample at its start)
// skips it.
//
// A shard truncated or overwritten while the loader reads it fails the
// batch with Corruption naming the shard, instead of a SIGBUS or an LMDB
// assertion (core/fault_guard.h).
//
// Errors: a batch with a record that fails to load ends the epoch's stream:
// Next() returns that error (again on every call), its slot is not held,
// position() stays at that batch, and StartEpoch(position) loads it anew.
//
// Thread-safety: Next/Release/StartEpoch are called from one consumer
// thread; the loader's workers are internal.
#ifndef KILN_LOADER_H_
#define KILN_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/geometry.h"
#include "kiln/status.h"

namespace kiln {

// LoaderOptions::readahead_bytes: min(256 MiB, a quarter of the memory
// available to the process).
inline constexpr uint64_t kAutoReadAhead = ~uint64_t{0};

// How LoaderOptions::crop cuts each sample's output out of its stored image.
enum class CropKind {
  // A crop x crop window of the stored record (the whole record when crop
  // is 0): seeded with random_crop, else centred as torchvision's
  // CenterCrop. Records of one fixed shape, any dtype.
  kWindow,
  // torchvision's RandomResizedCrop(crop, scale, ratio): a box drawn per
  // sample as RandomResizedCrop.get_params draws it (LoaderOptions::rrc),
  // resized to crop x crop as PIL's img.crop(box).resize(size, BILINEAR).
  // uint8 CHW images, of one size or each of its own (format 2).
  kRandomResized,
  // torchvision's Resize(resize) + CenterCrop(crop) (the evaluation
  // transform); exact, without resampling, on a cache built with
  // --shorter-side equal to `resize`. uint8 CHW images, as kRandomResized.
  kResizeCenter,
};

struct LoaderOptions {
  uint64_t batch_size = 256;  // samples per batch
  int workers = 2;            // filling threads
  bool shuffle = true;        // seeded permutation per epoch; false = sequential (evaluation)
  uint64_t seed = 0;          // permutation and augmentation seed
  bool drop_last = false;     // drop the short last batch (and, distributed, the tail)
  int rank = 0;               // this process's rank, 0 <= rank < world_size
  int world_size = 1;         // number of ranks sharing each epoch
  uint32_t crop = 0;          // output H = W = crop from a larger CHW record; 0 = no crop
  CropKind crop_kind = CropKind::kWindow;  // how the crop is cut (see CropKind)
  bool random_crop = false;     // kWindow: seeded random window per sample; false: center crop
  uint32_t resize = 0;          // kResizeCenter: the shorter side before the crop; 0 = none
  RandomResizedCropParams rrc;  // kRandomResized: the scale and ratio ranges
  bool random_flip = false;   // seeded horizontal flip with probability 1/2
  // The output's element type: none = as stored. For a uint8 cache,
  // kFloat16 or kFloat32 normalize with the manifest's mean and std
  // (kiln::InputNormalization) in the same pass as the crop.
  std::optional<DType> output_dtype;
  // The largest crop SetResolution may set later (resolution schedules):
  // slots are sized for it. 0 = crop.
  uint32_t max_crop = 0;
  bool verify_checksums = false;  // recompute each record's checksum while loading
  // A cache of JPEG images (a field of codec jpeg): decode a box that is at
  // least twice its output size at a DCT scale of 1/2, 1/4 or 1/8 (faster;
  // within docs/format.md's stated error of Pillow's decode + resize).
  // false: always at scale 1, equal to Pillow's.
  bool dct_scaling = true;
  // Bytes of upcoming records requested from the disk but not yet copied,
  // at most; 0 = no read-ahead.
  uint64_t readahead_bytes = kAutoReadAhead;
};

// Where one of a record's other fields (not the image, not the label)
// goes in a batch: `data` holds batch_size x LoaderField::sample_bytes;
// `lengths` batch_size x LoaderField::variable_dims entries (null for a
// field of one fixed shape).
struct FieldSlot {
  void* data = nullptr;
  int64_t* lengths = nullptr;
};

// Caller-owned memory for one batch: `data` holds batch_size x
// Loader::sample_bytes() bytes, `labels` batch_size entries.
struct BatchSlot {
  void* data = nullptr;
  int64_t* labels = nullptr;
  // Optional, batch_size x 5 entries: per sample the box of its stored
  // image the output shows (top, left, height, width) and 1 when flipped.
  int64_t* boxes = nullptr;
  // The other fields, in LoaderFields' order; empty: not delivered.
  std::vector<FieldSlot> fields;
};

// How the loader delivers one of a record's other fields (every field but
// the image and the label), in batches:
//  - kPlain: as stored; a dim that varies is padded with zeros to the
//    largest size it took in the cache (the manifest's max_shape), and
//    each sample's size along it goes to the lengths.
//  - kMask: a field named "mask" of the image's height and width (H x W or
//    K x H x W, uint8/int32/int64), when the loader crops or flips: it gets
//    the image's box and flip, resized with nearest neighbour (PIL's
//    crop(box).resize(size, NEAREST)), zeros where the image is padded.
//  - kBoxes: a float32 field named "boxes" of shape (N, 4), boxes as x1,
//    y1, x2, y2 in the stored image's pixels, when the loader crops or
//    flips: mapped into the output's pixels, clipped to it, and dropped when
//    nothing of them is left; the lengths give the boxes kept.
struct LoaderField {
  enum Role { kPlain, kMask, kBoxes };
  std::string name;
  int index = 0;  // in the manifest's fields
  DType dtype = DType::kUint8;
  Role role = kPlain;
  Shape shape;                           // one sample's, padded (kMask: the output's H, W)
  int variable_dims = 0;                 // dims whose size is reported in the lengths
  std::array<int, kMaxDims> variable{};  // which dims, in order
  uint64_t sample_bytes = 0;             // shape's elements x the dtype's size
};

// The other fields a loader with options `o` delivers for a cache with
// manifest `m`, in the manifest's order (at the largest resolution,
// max_crop, for a mask).
Status LoaderFields(const Manifest& m, const LoaderOptions& o, std::vector<LoaderField>* out);

struct Batch {
  int slot = -1;        // index into the slots given to Open
  uint64_t size = 0;    // samples in this batch (the last may be short)
  uint64_t epoch = 0;
  uint64_t index = 0;   // batch number within the epoch
};

// Where a loader stands: the next batch it will hand out.
struct LoaderPosition {
  uint64_t epoch = 0;
  uint64_t batch = 0;  // of the epoch's batches after `skip`
  uint64_t skip = 0;   // the samples of the epoch skipped at its start (StartEpoch)
  // The samples of the epoch's permutation the whole job (every rank) has
  // consumed: skip + batch x batch_size x world_size, at most the cache's
  // count. A loader of another world size or batch size continues the
  // epoch from there (elastic resume): StartEpoch(epoch, 0, consumed).
  uint64_t consumed = 0;
};

// LoaderPosition::consumed: of an epoch of `n` samples begun after `skip`,
// when each of `world_size` ranks has taken `batches` batches of
// `batch_size`: skip + batches x batch_size x world_size, at most n.
uint64_t ConsumedSamples(uint64_t n, uint64_t skip, uint64_t batches, uint64_t batch_size,
                         uint64_t world_size);

// The shape of one output sample for `o` on a cache with manifest `m` (the
// record shape, its H and W cropped): what a caller allocates slots for
// before Open. InvalidArgument for a crop or flip the records cannot take.
Status LoaderOutputShape(const Manifest& m, const LoaderOptions& o, Shape* out);
// The output's element type for `o` (the records' unless output_dtype).
// InvalidArgument for a conversion the loader does not make.
Status LoaderOutputDType(const Manifest& m, const LoaderOptions& o, DType* out);
// The bytes one slot's `data` must hold: batch_size samples of the largest
// output (max_crop) in the output dtype.
Status LoaderSlotBytes(const Manifest& m, const LoaderOptions& o, uint64_t* out);

class Loader {
 public:
  // REQUIRES: `reader` outlives the loader; slots non-empty, each sized as
  // above. Returns InvalidArgument for bad options (crop larger than the
  // record, rank out of range, zero batch size, records not CHW for crop).
  static Status Open(const CacheReader* reader, const LoaderOptions& options,
                     std::vector<BatchSlot> slots, std::unique_ptr<Loader>* out);
  ~Loader();  // stops and joins the workers

  // Output sample geometry (after crop) and bytes.
  const Shape& sample_shape() const;
  uint64_t sample_bytes() const;
  // Samples this rank sees per epoch and batches per epoch.
  uint64_t samples_per_epoch() const;
  uint64_t batches_per_epoch() const;
  // The batches of the epoch begun last (StartEpoch), after its skip:
  // batches_per_epoch() for a whole one.
  uint64_t epoch_batches() const;
  // The read-ahead budget in bytes (readahead_bytes resolved; 0 = off).
  uint64_t readahead_bytes() const;

  // Sets the output size for the next epochs (resolution schedules): the
  // crop becomes `crop`, at most the max_crop given to Open; samples are
  // packed at the new size from the slot's start. REQUIRES: no slot held
  // (call it between epochs, before StartEpoch). InvalidArgument for a size
  // the records or the slots cannot take.
  Status SetResolution(uint32_t crop);

  // Begins epoch `epoch` at batch `start_batch` (to resume mid-epoch).
  // With `skip`, the epoch is what is left of it after the first `skip`
  // samples of its permutation (the whole job's, LoaderPosition::consumed
  // of a loader of any world size or batch size): those are partitioned
  // over this loader's ranks as a whole epoch is, and `start_batch` counts
  // batches of them - so that a job restarted on fewer or more ranks sees
  // every remaining sample once. The next epoch is whole again.
  // REQUIRES: every slot handed out earlier has been released.
  Status StartEpoch(uint64_t epoch, uint64_t start_batch = 0, uint64_t skip = 0);
  // Waits for the next batch. Returns NotFound at the end of the epoch, the
  // Status (naming shard and record) of a record that failed to load, or
  // InvalidArgument when the batch's slot is still held (never released).
  Status Next(Batch* out);
  // The consumer is done with `slot`; it may be refilled.
  void Release(int slot);
  LoaderPosition position() const;
  // LoaderPosition::consumed for a position of (skip, batch) in an epoch.
  uint64_t Consumed(uint64_t skip, uint64_t batch) const;

  // The sample indices of this rank's epoch, in order (for tests and
  // tools); with `skip`, of what is left after the first `skip` samples.
  std::vector<uint64_t> EpochOrder(uint64_t epoch, uint64_t skip = 0) const;

 private:
  class Impl;  // the implementation (the .cc file)
  explicit Loader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln

#endif  // KILN_LOADER_H_
