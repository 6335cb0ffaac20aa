// PIL-compatible antialiased bilinear resampling (kiln::pixels: the build and the loader share it).
//
// Reproduces Pillow's Image.resize(size, BILINEAR, box) for 8-bit images:
// separable triangle filter whose support is scaled by the downscale
// factor, coefficients normalised to sum 1 and rounded to 22-bit fixed point,
// two passes through an 8-bit intermediate image, each rounding to nearest,
// in Pillow 13's order (PillowVerticalFirst). Written for kiln from the
// description of the algorithm; output is bit-identical to Pillow 13 on the
// tested inputs, and to Pillow 9.4 wherever the horizontal pass goes first.
#ifndef KILN_SRC_PIXELS_RESAMPLE_H_
#define KILN_SRC_PIXELS_RESAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::pixels {

// Filter taps for output positions [begin, end) of one axis that maps the
// input interval [in0, in1) (in input pixels; in1 may be fractional) onto
// out_size output pixels.
struct AxisTaps {
  int ksize = 0;                 // stride of `weights` per output position
  std::vector<int> first;        // first input index of each output position
  std::vector<int> count;        // taps used by each output position
  std::vector<int32_t> weights;  // fixed-point weights, ksize per position
  std::vector<double> work;      // ComputeAxisTaps's scratch
};

AxisTaps ComputeAxisTaps(int in_size, double in0, double in1, int out_size, int begin, int end);
// The same into `taps`, reusing its memory.
void ComputeAxisTaps(int in_size, double in0, double in1, int out_size, int begin, int end,
                     AxisTaps* taps);

// One pair of taps for eight outputs of the one-channel AVX2 kernel: the
// byte shuffle that pairs the taps' pixels, and the high and low parts of
// their weights.
struct PlaneTapPair {
  int8_t control[32];
  int16_t kh[16], kl[16];
};

// The same for sixteen outputs of the AVX-512 kernel.
struct PlaneTapPair512 {
  int8_t control[64];
  int16_t kh[32], kl[32];
};

// Buffers ResampleRegion needs, kept between calls by a caller that
// resamples many images (the loader: no allocation per sample once they
// have grown to the largest image's needs).
struct ResampleScratch {
  AxisTaps horizontal, vertical;
  std::vector<uint8_t> temp;
  std::vector<int16_t> madd;
  std::vector<int32_t> acc;
  std::vector<const uint8_t*> rows;
  std::vector<int> plane_bases;
  std::vector<PlaneTapPair> plane_pairs;
  std::vector<PlaneTapPair512> plane_pairs512;
};

// Resamples `in` (in_w x in_h x channels, packed HWC) so that the box
// [0, box_w) x [0, box_h) of it becomes an out_w x out_h image, and writes
// only the region of that image starting at (x0, y0) of size
// region_w x region_h into dst (row stride dst_stride bytes).
// REQUIRES: the region lies inside [0, out_w) x [0, out_h); channels 1..4.
void ResampleRegion(const uint8_t* in, int in_w, int in_h, int channels, double box_w, double box_h,
                    int out_w, int out_h, int x0, int y0, int region_w, int region_h, uint8_t* dst,
                    size_t dst_stride, ResampleScratch* scratch = nullptr);

// ResampleRegion for `planes` one-channel images (planar CHW data): plane p
// is read at in + p * in_plane (rows in_stride bytes apart; in_w x in_h
// pixels, which may be a box of a larger image) and its region written at
// dst + p * dst_plane (rows dst_stride apart). With `flip` the region is
// written mirrored along x (its column j holds column region_w - 1 - j).
// Each plane gets exactly ResampleRegion's bytes for one channel (PIL
// resamples every channel alike), computed with the taps made once. A box
// may start at a fractional (box_x0, box_y0) of `in` (Pillow's resize with
// box=): it is then [box_x0, box_x0 + box_w) x [box_y0, box_y0 + box_h).
void ResamplePlanes(const uint8_t* in, size_t in_stride, size_t in_plane, int planes, int in_w,
                    int in_h, double box_w, double box_h, int out_w, int out_h, int x0, int y0,
                    int region_w, int region_h, bool flip, uint8_t* dst, size_t dst_stride,
                    size_t dst_plane, ResampleScratch* scratch = nullptr, double box_x0 = 0,
                    double box_y0 = 0);

// Whether Pillow 13 (and kiln) resamples an in_w x in_h image to
// out_w x out_h with the vertical pass first: when the height shrinks by
// more than twice what the width does. Pillow 12 and older always ran the
// horizontal pass first; the order changes the 8-bit intermediate's rounding
// (a pixel off by one), never a single-axis resize.
bool PillowVerticalFirst(int in_w, int in_h, int out_w, int out_h);

// The kernels ResampleRegion may use, each level including those below it;
// every level gives the same bytes. The default is the fastest the CPU
// supports. For tests and benchmarks.
enum KernelLevel { kKernelsPortable = 0, kKernelsSse41 = 1, kKernelsAvx2 = 2, kKernelsAvx512 = 3 };
void UseKernelsUpTo(KernelLevel level);

}  // namespace kiln::pixels

#endif  // KILN_SRC_PIXELS_RESAMPLE_H_
