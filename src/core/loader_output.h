// The loader's output, as the loader and its callers compute it (internal
// to kiln::core; the public functions are in kiln/loader.h).
#ifndef KILN_SRC_CORE_LOADER_OUTPUT_H_
#define KILN_SRC_CORE_LOADER_OUTPUT_H_

#include "kiln/loader.h"
#include "kiln/manifest.h"

namespace kiln::internal {

// The stored image field: its spec (format 1: made from the manifest).
FieldSpec ImageSpec(const Manifest& m);

// Whether samples go through a SampleWriter (resampled or converted)
// rather than the window copy.
bool UsesWriter(const Manifest& m, const LoaderOptions& o);

// The output shape for a crop of `crop` (LoaderOutputShape's checks).
Status OutputShapeFor(const Manifest& m, const LoaderOptions& o, uint32_t crop, Shape* out);

// Whether the loader cuts or flips each sample (a mask and boxes follow).
bool MovesPixels(const LoaderOptions& o);

}  // namespace kiln::internal

#endif  // KILN_SRC_CORE_LOADER_OUTPUT_H_
