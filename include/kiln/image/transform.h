// Geometric transforms and tensor layout, with torchvision's semantics.
//
// ResizeAndCrop reproduces torchvision's `Resize(S)` (or `Resize((H, W))`)
// followed by `CenterCrop(C)` on a PIL image: the resize is PIL's
// antialiased bilinear `Image.resize(..., BILINEAR)` (separable triangle
// filter whose support grows with the downscale factor, 8-bit fixed-point
// coefficients), reimplemented so that results agree with PIL to the last
// bit on full-size inputs.
//
// Thread-safety: all functions are pure; call them from any thread.
#ifndef KILN_IMAGE_TRANSFORM_H_
#define KILN_IMAGE_TRANSFORM_H_

#include <cstddef>
#include <cstdint>

#include "kiln/image/decode.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln::image {

struct ResizeSpec {
  // torchvision Resize(S): the shorter side becomes S, the longer side
  // int(S * long / short). 0 = no shorter-side resize.
  int resize_shorter = 0;
  // torchvision CenterCrop(C): a C x C crop from the centre; zero padding
  // when the image is smaller (as torchvision pads). 0 = no crop.
  int crop = 0;
  // Resize to exactly squash_w x squash_h, ignoring aspect (torchvision
  // Resize((H, W))). Both or neither; excludes resize_shorter.
  int squash_w = 0;
  int squash_h = 0;
  // torchvision Resize(S, max_size=N) (with resize_shorter S) or
  // Resize(None, max_size=N) (without): when the longer side, after the
  // shorter-side resize if any, exceeds N, it becomes N and the shorter one
  // int(N * short / long) (at least 1); smaller images keep their size.
  // FFCV's max_resolution. 0 = no bound. Excludes squash; with
  // resize_shorter, must exceed it (as torchvision requires).
  int max_side = 0;
};

// The size after the resize step, before the crop, for an image whose
// header says in_w x in_h. Callers pass it as DecodeOptions::min_width /
// min_height. Returns InvalidArgument for non-positive sizes or a bad spec.
Status PlanResize(int in_w, int in_h, const ResizeSpec& spec, int* resized_w, int* resized_h);

// The final output size (after resize and crop) for an in_w x in_h image.
Status PlanGeometry(int in_w, int in_h, const ResizeSpec& spec, int* out_w, int* out_h);

// Resizes and centre-crops `in` into *out (replaced). Geometry is planned
// from in.source_width/source_height when set (so DCT-downscaled decodes
// produce the same output size as full decodes, with the sampling grid
// mapped onto the smaller image). REQUIRES: &in != out.
Status ResizeAndCrop(const ImageU8& in, const ResizeSpec& spec, ImageU8* out);

// The record element types (kiln::DType of the cache format).
using kiln::DType;

// Writes `in` (HWC) as CHW of `dtype` into dst, which the caller owns and
// which must hold in.channels * in.height * in.width * DTypeSize(dtype)
// bytes. kUint8: a plain relayout. kFloat32/kFloat16: (x / 255 - mean[c]) /
// std[c] computed in float32 (as torchvision's ToTensor + Normalize), fp16
// as IEEE binary16 rounded to nearest even. mean/std point to in.channels
// values each, or are both null for mean 0, std 1 (ignored for kUint8).
// Returns InvalidArgument for an empty image or a zero std.
Status ToCHW(const ImageU8& in, DType dtype, const float* mean, const float* std, void* dst);

// IEEE binary16 bits of `value`, rounded to nearest even (NaN stays NaN,
// overflow gives infinity). Exposed for tests and for callers that store
// other half-precision values.
uint16_t FloatToHalf(float value);

}  // namespace kiln::image

#endif  // KILN_IMAGE_TRANSFORM_H_
