// What the translation units of kiln._kiln share (internal header): the
// Status-to-exception bridge, numpy dtype names, the manifest's fields as
// Python values, kiln.Cache's native side, and the bindings of kiln.Writer
// (writer_binding.cc) and kiln.Loader (loader_binding.cc).
#ifndef KILN_SRC_PYTHON_BINDING_H_
#define KILN_SRC_PYTHON_BINDING_H_

#include <pybind11/pybind11.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln::python {

namespace py = pybind11;

// Carries a non-OK Status across pybind11 to the module's exception
// translator (kiln_module.cc), which raises the matching Python error.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  Status::Code code() const { return code_; }

 private:
  Status::Code code_;
};

inline void Check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

// The numpy dtype string of a record dtype (little-endian on disk; kiln
// runs on little-endian hosts only).
inline const char* NumpyDType(DType d) {
  switch (d) {
    case DType::kUint8:
      return "u1";
    case DType::kFloat16:
      return "<f2";
    case DType::kFloat32:
      return "<f4";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
  }
  return "u1";
}

// The manifest's fields as a list of (name, dtype name, shape, max_shape)
// tuples, a variable dim None in shape (format 1: image and label).
py::list FieldsList(const Manifest& m);

// Raises RuntimeError when an object made in process `owner` is used in
// another (after fork(): see kiln_module.cc).
void CheckSameProcess(pid_t owner, const char* what);

// A shape as a Python tuple of ints.
py::tuple ShapeTuple(const Shape& s);

// A finished cache opened read-only (CacheReader), with one read
// transaction for record-at-a-time access from Python: kiln._kiln.Cache
// (kiln_module.cc). Not thread-safe on its own; the GIL, held throughout
// Get(), serializes callers.
class PyCache {
 public:
  explicit PyCache(const std::string& dir);
  ~PyCache();

  const CacheReader* reader() const { return reader_.get(); }
  pid_t pid() const { return pid_; }

  // Record `index` as {field name: a fresh numpy array} (a format 1
  // cache's "image" and "label"; a scalar field is a 0-d array). The copy
  // is needed: the view into the memory map dies with the transaction.
  // decode=false: an encoded field as its stored bytes (a 1-d uint8 array).
  py::dict Get(int64_t index, bool verify, bool decode);

 private:
  pid_t pid_;
  std::unique_ptr<CacheReader> reader_;
  std::unique_ptr<ReadTxn> txn_;
};

// Adds kiln._kiln.Writer (writer_binding.cc).
void BindWriter(py::module_& m);

// Adds kiln._kiln.merge and merge_parts (merge_binding.cc).
void BindMerge(py::module_& m);

// Adds kiln._kiln.Loader, LoaderOptions and the loader's geometry
// (output_shape, output_dtype, loader_fields, slot_bytes,
// random_resized_crop_boxes) (loader_binding.cc).
void BindLoader(py::module_& m);

}  // namespace kiln::python

#endif  // KILN_SRC_PYTHON_BINDING_H_
