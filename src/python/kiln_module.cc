// kiln._kiln: the Python binding of kiln::core's CacheReader and Loader
// (the module, kiln.Cache and the functions here; kiln.Loader in
// loader_binding.cc, kiln.Writer in writer_binding.cc).
//
// This extension knows nothing of torch: the Python package (python/kiln)
// allocates the ring of batch slots (torch tensors, pinned when asked, or
// numpy arrays) and hands their addresses to _kiln.Loader, whose worker
// threads fill them in place. Each call that waits on the workers releases
// the GIL.
//
// Ownership: a Loader keeps its Cache and the Python object that owns the
// slot memory (`keepalive`) alive; its workers are joined before either is
// dropped.
//
// fork(): worker threads and LMDB handles do not survive fork. An object
// used in a child process other than the one that made it raises
// RuntimeError; when such an object is destroyed in the child, its C++
// state is deliberately leaked (joining threads the child never had, or
// closing LMDB environments whose reader slots belong to the parent, would
// hang or corrupt the parent's state).
//
// Errors: a kiln::Status becomes a Python exception: Corruption ->
// kiln.CorruptionError (a ValueError), NotFound -> FileNotFoundError,
// InvalidArgument -> ValueError, IOError -> OSError, NotSupported and
// Stale -> RuntimeError. The message is kiln's, naming shard and record.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpus.h"
#include "core/escape.h"
#include "core/fault_guard.h"
#include "core/launch_env.h"
#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "python/binding.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

PyObject* g_corruption_error = nullptr;  // kiln.CorruptionError, set at import

void TranslateStatusError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const StatusError& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.code()) {
      case Status::Code::kCorruption: type = g_corruption_error; break;
      case Status::Code::kNotFound: type = PyExc_FileNotFoundError; break;
      case Status::Code::kInvalidArgument: type = PyExc_ValueError; break;
      case Status::Code::kIOError: type = PyExc_OSError; break;
      default: break;
    }
    PyErr_SetString(type, e.what());
  }
}

}  // namespace

void CheckSameProcess(pid_t owner, const char* what) {
  if (getpid() != owner)
    throw std::runtime_error(std::string(what) +
                             " was made in process " + std::to_string(owner) +
                             " and cannot be used after fork(): its worker threads and LMDB "
                             "handles stayed in the parent. Make a new one in the child.");
}

py::tuple ShapeTuple(const Shape& s) {
  py::tuple t(s.ndim);
  for (int i = 0; i < s.ndim; ++i) t[i] = s.dims[i];
  return t;
}

PyCache::PyCache(const std::string& dir) : pid_(getpid()) {
  Check(CacheReader::Open(dir, ReaderOptions(), &reader_));
  txn_ = reader_->BeginRead();
}

PyCache::~PyCache() {
  if (getpid() != pid_) {  // see fork() above
    (void)txn_.release();
    (void)reader_.release();
  }
}

py::dict PyCache::Get(int64_t index, bool verify, bool decode) {
  CheckSameProcess(pid_, "this kiln.Cache");
  const int64_t n = static_cast<int64_t>(reader_->size());
  if (index < 0) index += n;
  if (index < 0 || index >= n)
    throw py::index_error("record " + std::to_string(index) + " out of range for " +
                          std::to_string(n) + " records");
  const Manifest& m = reader_->manifest();
  RecordView v;
  Status s;
  std::string fault;
  // Guarded: a shard changed under the map is an error, not a crash. The
  // header is read first (the arrays' shapes), then the payloads are
  // copied into the arrays, made between the two outside the guard.
  bool read = GuardedRead([&] { s = txn_->Get(static_cast<uint64_t>(index), &v, verify); }, &fault);
  std::vector<py::array> arrays;
  if (read && s.ok()) {
    for (int f = 0; f < v.num_fields; ++f) {
      const FieldView& fv = v.fields[f];
      std::vector<py::ssize_t> dims(fv.shape.dims.begin(), fv.shape.dims.begin() + fv.shape.ndim);
      // Without decode, an encoded field comes out as its stored bytes.
      if (!decode && fv.codec != Codec::kRaw) dims = {static_cast<py::ssize_t>(fv.bytes)};
      arrays.emplace_back(py::dtype(NumpyDType(fv.dtype)), dims);
    }
    std::vector<uint8_t> decoded;  // a JPEG field's pixels
    read = GuardedRead(
        [&] {
          for (int f = 0; f < v.num_fields && s.ok(); ++f) {
            const FieldView& fv = v.fields[f];
            if (fv.codec != Codec::kRaw && decode) {
              s = DecodeField(fv,
                              reader_->dir() + ": record " + std::to_string(index) + ", field '" +
                                  m.fields[f].name + "'",
                              &decoded);
              if (s.ok()) std::memcpy(arrays[f].mutable_data(), decoded.data(), decoded.size());
            } else if (fv.bytes > 0) {
              std::memcpy(arrays[f].mutable_data(), fv.data, fv.bytes);
            }
          }
        },
        &fault);
  }
  txn_->Reset();
  if (!read)
    s = Status::Corruption(reader_->dir() + ": record " + std::to_string(index) + ": " + fault +
                           "; check it with kiln verify");
  Check(s);
  py::dict out;
  for (int f = 0; f < v.num_fields; ++f) out[py::str(m.fields[f].name)] = std::move(arrays[f]);
  return out;
}

}  // namespace kiln::python

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "kiln's C++ cache reader and loader (use the kiln package, not this module)";

  static py::exception<StatusError> corruption(m, "CorruptionError", PyExc_ValueError);
  g_corruption_error = corruption.ptr();
  py::register_exception_translator(&TranslateStatusError);
  m.attr("__version__") = KilnVersion();
#if PYBIND11_VERSION_MAJOR < 3 && PYBIND11_VERSION_MINOR < 12
  // pybind11 before 2.12 reads NumPy 1's dtype layout: under NumPy 2 its
  // arrays get itemsize 0 (every stride 0: each record reads as its first
  // value). Refuse to load rather than return wrong data.
  {
    const std::string v = py::module_::import("numpy").attr("__version__").cast<std::string>();
    if (std::atoi(v.c_str()) >= 2)
      throw py::import_error("kiln: this module was built with pybind11 " PYBIND11_TOSTRING(
          PYBIND11_VERSION_MAJOR) "." PYBIND11_TOSTRING(PYBIND11_VERSION_MINOR) ", which cannot "
          "read NumPy " + v + " arrays (pybind11 >= 2.12 can): rebuild kiln with a newer "
          "pybind11 (tools/setup.sh gpu uses PyPI's), or use NumPy 1.x");
  }
#endif
  m.def(
      "unescape_name",
      [](const std::string& text) {
        std::string name;
        if (!UnescapeName(text, &name))
          throw std::invalid_argument(
              "'" + text +
              "' is not a name kiln escaped (it writes \\\\, \\t, \\n, \\r and \\xNN)");
        return py::bytes(name);
      },
      py::arg("text"), "The raw bytes of a name kiln wrote escaped (docs/format.md, Names)");
  m.def(
      "launch_environment",
      [] {
        LaunchEnvironment e;
        Check(ReadLaunchEnvironment(&e));
        return py::make_tuple(e.rank, e.world, e.local_rank);
      },
      "(rank, world_size, local_rank) from RANK, WORLD_SIZE and LOCAL_RANK (-1 when unset), as "
      "kiln train reads them");
  m.def(
      "train_environment",
      [] {
        py::dict d;
        for (const auto& [name, value] : TorchProcessEnvironment()) d[py::str(name)] = value;
        return d;
      },
      "The environment variables kiln train starts LibTorch in when they are unset "
      "(OpenMP's passive waits, glibc malloc keeping freed memory)");
  m.def("cpu_has_native_bf16", &CpuHasNativeBf16,
        "Whether this CPU computes bf16 natively (AVX512-BF16 or AMX in /proc/cpuinfo)");
  m.def(
      "verify",
      [](const std::string& path, const std::string& level, int threads) {
        VerifyOptions o;
        Check(ParseVerifyLevel(level, &o.level));
        o.threads = threads;
        VerifyReport r;
        Status s;
        {
          py::gil_scoped_release unlocked;
          s = VerifyCache(path, o, &r);
        }
        Check(s);
        return VerifyReportToJson(path, r);
      },
      py::arg("path"), py::arg("level") = "full", py::arg("threads") = 0,
      "kiln verify's report of the cache at `path`, as the JSON of `kiln verify --json`");

  py::class_<PyCache, std::shared_ptr<PyCache>>(m, "Cache")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def_property_readonly("path", [](const PyCache& c) { return c.reader()->dir(); })
      .def_property_readonly("count", [](const PyCache& c) { return c.reader()->size(); })
      .def_property_readonly(
          "shape", [](const PyCache& c) { return ShapeTuple(c.reader()->manifest().shape); })
      .def_property_readonly(
          "dtype", [](const PyCache& c) { return DTypeName(c.reader()->manifest().dtype); })
      .def_property_readonly("record_bytes",
                             [](const PyCache& c) { return c.reader()->record_bytes(); })
      .def_property_readonly("classes",
                             [](const PyCache& c) { return c.reader()->manifest().classes; })
      .def_property_readonly(
          "preprocessing_json",
          [](const PyCache& c) { return c.reader()->manifest().preprocessing.ToJson(); })
      .def_property_readonly(
          "manifest_json", [](const PyCache& c) { return ManifestToJson(c.reader()->manifest()); })
      .def("get", &PyCache::Get, py::arg("index"), py::arg("verify") = false,
           py::arg("decode") = true)
      .def_property_readonly("image_field",
                             [](const PyCache& c) {
                               const Manifest& m = c.reader()->manifest();
                               return m.fields.empty() ? std::string("image")
                                                       : m.fields[m.image_field].name;
                             })
      .def_property_readonly("label_field",
                             [](const PyCache& c) -> py::object {
                               const Manifest& m = c.reader()->manifest();
                               if (m.fields.empty()) return py::str("label");
                               if (m.label_field < 0) return py::none();
                               return py::str(m.fields[m.label_field].name);
                             })
      .def_property_readonly("format_version",
                             [](const PyCache& c) { return c.reader()->manifest().format_version; })
      .def_property_readonly("fields",
                             [](const PyCache& c) { return FieldsList(c.reader()->manifest()); })
      .def_property_readonly("normalization", [](const PyCache& c) -> py::object {
        std::vector<double> mean, std;
        Check(InputNormalization(c.reader()->manifest(), c.reader()->dir(), &mean, &std));
        if (mean.empty()) return py::none();
        return py::make_tuple(mean, std);
      });

  BindWriter(m);
  BindMerge(m);

  BindLoader(m);
}
