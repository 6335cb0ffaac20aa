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

#include "kiln/geometry.h"
#include "kiln/image/decode.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln::image {

// The geometry (kiln/geometry.h) is core's: the loader applies it too.
using kiln::PlanGeometry;
using kiln::PlanResize;
using kiln::ResizeSpec;

// Resizes and centre-crops `in` into *out (replaced). Geometry is planned
// from in.source_width/source_height when set (so DCT-downscaled decodes
// produce the same output size as full decodes, with the sampling grid
// mapped onto the smaller image). REQUIRES: &in != out.
Status ResizeAndCrop(const ImageU8& in, const ResizeSpec& spec, ImageU8* out);

// A segmentation mask's ResizeAndCrop: `in` (one channel, the size of
// its image's source) resized with nearest neighbour - PIL's
// resize(size, NEAREST): output pixel x takes input floor((x + 0.5) x in /
// out) - to the size `spec` plans for it, then centre-cropped as the
// image is (zeros where the crop pads). REQUIRES: &in != out.
Status ResizeAndCropNearest(const ImageU8& in, const ResizeSpec& spec, ImageU8* out);

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

using kiln::FloatToHalf;

}  // namespace kiln::image

#endif  // KILN_IMAGE_TRANSFORM_H_
