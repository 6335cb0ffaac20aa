// Records back into pictures: one record as an image file (kiln export) and
// a labelled contact sheet of a seeded sample (kiln preview), to see what a
// model will see.
//
// Thread-safety: the functions keep no state. Those that take a
// CacheReader open their own ReadTxn, so several may run on one reader at
// once.
#ifndef KILN_IMAGE_RENDER_H_
#define KILN_IMAGE_RENDER_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/image/decode.h"
#include "kiln/manifest.h"
#include "kiln/status.h"

namespace kiln::image {

// The 8-bit picture of one record of the cache `m` describes (HWC, RGB for
// 3 channels, luminance for 1; *out is replaced). Float records are
// de-normalized with the manifest's per-channel mean and std (0 and 1 when
// it records none; one value serves every channel): each element x becomes
// round((x * std[c] + mean[c]) * 255), computed in float and clamped to
// 0..255. uint8 records are their bytes. Returns InvalidArgument for a
// record that is not C x H x W with C = 1 or 3, or a mean/std whose count
// fits neither.
Status RecordToImage(const Manifest& m, const RecordView& record, ImageU8* out);

// The colour (RGB) class k of a mask is drawn in: PASCAL VOC's colour map
// (class 1 dark red, 2 dark green, 3 olive, ...; k taken mod 256).
std::array<uint8_t, 3> MaskColour(int64_t k);
// The colour (RGB) of box outlines.
inline constexpr std::array<uint8_t, 3> kBoxColour = {255, 255, 0};

// RecordToImage, with the record's annotations (kiln/manifest.h's
// IsMaskField, IsBoxesField) drawn over it:
//  - a mask of H x W: each pixel of class k != 0 becomes the mean of its
//    colour and MaskColour(k), (a + b + 1) / 2 per channel (class 0 is
//    background and left as it is; a K x H x W mask is not drawn);
//  - boxes: each clipped to the image (0..W, 0..H), then outlined one
//    pixel wide in kBoxColour, from column floor(x1) and row floor(y1) to
//    column ceil(x2) - 1 and row ceil(y2) - 1 (a box left empty draws
//    nothing).
// A picture with annotations is RGB (a 1-channel image is grey in it).
Status RecordToPicture(const Manifest& m, const RecordView& record, ImageU8* out);

// Writes `img` to `path` with OpenCV in the format its extension names
// (.png, .jpg, .bmp, .tiff, .webp). Returns InvalidArgument for an
// extension OpenCV cannot write, IOError naming `path` when the file
// cannot be written.
Status WriteImage(const ImageU8& img, const std::string& path);

// Writes record `index` of `reader`'s cache to `path` (RecordToPicture,
// then WriteImage). Returns InvalidArgument naming the record count for an
// index past the end, Corruption for a damaged record (its checksum is
// verified), and WriteImage's errors.
Status ExportRecord(const CacheReader& reader, uint64_t index, const std::string& path);

// The margin around and between the tiles of a contact sheet, in pixels.
inline constexpr int kPreviewGap = 4;
// The strip under each tile that holds its label, in pixels.
inline constexpr int kPreviewLabelHeight = 16;
// The most a contact sheet holds: records with sides up to kMaxPreviewSide
// pixels, kMaxPreviewTiles of them, kMaxPreviewPixels in all.
inline constexpr uint32_t kMaxPreviewSide = 1 << 14;
inline constexpr size_t kMaxPreviewTiles = 1 << 12;
inline constexpr int64_t kMaxPreviewPixels = int64_t{1} << 28;

struct PreviewOptions {
  uint64_t count = 16;               // tiles; fewer when fewer records qualify
  std::vector<std::string> classes;  // only records of these classes; empty = every record
  uint64_t seed = 0;                 // of the sample (kiln/shuffle.h SeededSample)
  // Each record is scaled up by the smallest whole factor that makes its
  // longer side at least this many pixels (nearest neighbour, so each
  // stored pixel stays one flat square); never scaled down.
  int min_tile = 96;
  int columns = 0;  // tiles per row (at most the tiles); 0 = the smallest c with c * c >= tiles
};

// Where the tiles of a contact sheet go. Tile i sits at column i % columns,
// row i / columns, its top left corner at (kPreviewGap + column * (tile_width
// + kPreviewGap), kPreviewGap + row * (tile_height + kPreviewLabelHeight +
// kPreviewGap)), with its label strip under it.
struct PreviewLayout {
  int columns = 0, rows = 0;
  int scale = 1;                        // whole upscaling factor of each record
  int tile_width = 0, tile_height = 0;  // record width and height x scale
  int width = 0;                        // = columns * (tile_width + kPreviewGap) + kPreviewGap
  int height = 0;  // = rows * (tile_height + kPreviewLabelHeight + kPreviewGap) + kPreviewGap
};

// The shape a contact sheet's tiles are planned for: the manifest's image
// shape, or, where the image's size varies from record to record (whole
// images, format 2), C x the largest H x the largest W it took (each
// record is then drawn at its own size in the top left corner of its
// tile). ndim 0 when the image field is not C x H x W.
Shape PreviewShape(const Manifest& m);

// The layout of a sheet of `tiles` records of shape C x H x W (`shape`).
// REQUIRES: tiles >= 1 and a 3-dimensional shape.
PreviewLayout PlanPreview(const Shape& shape, size_t tiles, const PreviewOptions& options);

// The records a preview shows, in increasing order: SeededSample of
// options.count among the records whose label names one of
// options.classes (every record when it is empty). Returns InvalidArgument
// for a class the cache does not have, listing its classes, and for a
// selection that holds no record; Corruption for a record whose header is
// damaged.
Status PickPreviewRecords(const CacheReader& reader, const PreviewOptions& options,
                          std::vector<uint64_t>* indices);

// Draws the records `indices` of `reader`'s cache into a contact sheet
// (*sheet is replaced; always 3 channels, RGB) laid out by PlanPreview of
// PreviewShape, each tile RecordToPicture's picture (annotations drawn)
// and labelled "<class> #<index>" (just "#<index>" without a class name).
// Returns InvalidArgument for an empty `indices` or a sheet over the
// bounds above, and
// RecordToPicture's and ReadTxn::Get's errors (checksums are verified).
Status RenderPreview(const CacheReader& reader, const std::vector<uint64_t>& indices,
                     const PreviewOptions& options, ImageU8* sheet);

// PickPreviewRecords, RenderPreview and WriteImage to `path`; *shown (when
// not null) receives the records drawn.
Status WritePreview(const CacheReader& reader, const PreviewOptions& options,
                    const std::string& path, std::vector<uint64_t>* shown = nullptr);

}  // namespace kiln::image

#endif  // KILN_IMAGE_RENDER_H_
