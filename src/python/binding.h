// What the translation units of kiln._kiln share (internal header): the
// Status-to-exception bridge, numpy dtype names, the manifest's fields as
// Python values, and the binding of kiln.Writer (writer_binding.cc).
#ifndef KILN_SRC_PYTHON_BINDING_H_
#define KILN_SRC_PYTHON_BINDING_H_

#include <pybind11/pybind11.h>

#include <stdexcept>

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

// Adds kiln._kiln.Writer (writer_binding.cc).
void BindWriter(py::module_& m);

}  // namespace kiln::python

#endif  // KILN_SRC_PYTHON_BINDING_H_
