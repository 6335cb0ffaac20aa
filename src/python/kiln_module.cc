// kiln._kiln: the Python binding of kiln::core's CacheReader and Loader.
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

#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpus.h"
#include "kiln/cache_reader.h"
#include "kiln/loader.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

// Carries a non-OK Status across pybind11 to the translator below.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  Status::Code code() const { return code_; }

 private:
  Status::Code code_;
};

void Check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

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

void CheckSameProcess(pid_t owner, const char* what) {
  if (getpid() != owner)
    throw std::runtime_error(std::string(what) +
                             " was made in process " + std::to_string(owner) +
                             " and cannot be used after fork(): its worker threads and LMDB "
                             "handles stayed in the parent. Make a new one in the child.");
}

// The numpy dtype string of a record dtype (little-endian on disk; kiln
// runs on little-endian hosts only).
const char* NumpyDType(DType d) {
  switch (d) {
    case DType::kUint8: return "u1";
    case DType::kFloat16: return "<f2";
    case DType::kFloat32: return "<f4";
  }
  return "u1";
}

py::tuple ShapeTuple(const Shape& s) {
  py::tuple t(s.ndim);
  for (int i = 0; i < s.ndim; ++i) t[i] = s.dims[i];
  return t;
}

// A finished cache opened read-only (CacheReader), with one read
// transaction for record-at-a-time access from Python. Not thread-safe on
// its own; the GIL, held throughout get(), serializes callers.
class PyCache {
 public:
  explicit PyCache(const std::string& dir) : pid_(getpid()) {
    Check(CacheReader::Open(dir, ReaderOptions(), &reader_));
    txn_ = reader_->BeginRead();
  }
  ~PyCache() {
    if (getpid() != pid_) {  // see fork() above
      (void)txn_.release();
      (void)reader_.release();
    }
  }

  const CacheReader* reader() const { return reader_.get(); }
  pid_t pid() const { return pid_; }

  // Record `index` as (a fresh numpy array, label). The copy is needed:
  // the view into the memory map dies with the transaction.
  py::tuple Get(int64_t index, bool verify) {
    CheckSameProcess(pid_, "this kiln.Cache");
    const int64_t n = static_cast<int64_t>(reader_->size());
    if (index < 0) index += n;
    if (index < 0 || index >= n)
      throw py::index_error("record " + std::to_string(index) + " out of range for " +
                            std::to_string(n) + " records");
    RecordView v;
    Status s = txn_->Get(static_cast<uint64_t>(index), &v, verify);
    if (!s.ok()) {
      txn_->Reset();
      Check(s);
    }
    const Shape& sh = reader_->manifest().shape;
    std::vector<py::ssize_t> dims(sh.dims.begin(), sh.dims.begin() + sh.ndim);
    py::array a(py::dtype(NumpyDType(v.dtype)), dims);
    std::memcpy(a.mutable_data(), v.data, v.bytes);
    const int64_t label = v.label;
    txn_->Reset();
    return py::make_tuple(std::move(a), label);
  }

 private:
  pid_t pid_;
  std::unique_ptr<CacheReader> reader_;
  std::unique_ptr<ReadTxn> txn_;
};

// kiln::Loader over caller-owned slots given as addresses. The consumer
// holds at most one slot: next() hands the previously returned slot back
// before it waits for the next batch.
class PyLoader {
 public:
  PyLoader(std::shared_ptr<PyCache> cache, const LoaderOptions& options,
           const std::vector<uintptr_t>& data, const std::vector<uintptr_t>& labels,
           uint64_t slot_bytes, py::object keepalive)
      : pid_(getpid()), cache_(std::move(cache)), keepalive_(std::move(keepalive)) {
    CheckSameProcess(cache_->pid(), "the kiln.Cache given to this Loader");
    if (data.empty() || data.size() != labels.size())
      throw std::invalid_argument("kiln.Loader: need as many label buffers as data buffers (" +
                                  std::to_string(data.size()) + " vs " +
                                  std::to_string(labels.size()) + ")");
    std::vector<BatchSlot> slots;
    for (size_t i = 0; i < data.size(); ++i)
      slots.push_back({reinterpret_cast<void*>(data[i]), reinterpret_cast<int64_t*>(labels[i])});
    Check(Loader::Open(cache_->reader(), options, std::move(slots), &loader_));
    const uint64_t need = options.batch_size * loader_->sample_bytes();
    if (slot_bytes < need) {
      loader_.reset();
      throw std::invalid_argument("kiln.Loader: slots of " + std::to_string(slot_bytes) +
                                  " bytes, a batch needs " + std::to_string(need));
    }
  }
  ~PyLoader() {
    if (getpid() != pid_) {  // see fork() above
      (void)loader_.release();
      return;
    }
    py::gil_scoped_release unlocked;  // joining may wait for a worker's fill
    loader_.reset();
  }

  void StartEpoch(uint64_t epoch, uint64_t start_batch) {
    CheckSameProcess(pid_, "this kiln.Loader");
    ReleaseHeld();
    Status s;
    {
      py::gil_scoped_release unlocked;
      s = loader_->StartEpoch(epoch, start_batch);
    }
    Check(s);
  }

  // (slot, size, epoch, index) of the next batch, or None at the end of the
  // epoch. Raises the error of a record that failed to load (again on every
  // call until start_epoch).
  py::object Next() {
    CheckSameProcess(pid_, "this kiln.Loader");
    ReleaseHeld();
    Batch b;
    Status s;
    {
      py::gil_scoped_release unlocked;
      const auto t0 = std::chrono::steady_clock::now();
      s = loader_->Next(&b);
      wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (s.IsNotFound()) return py::none();
    Check(s);
    ++batches_;
    held_ = b.slot;
    return py::make_tuple(b.slot, b.size, b.epoch, b.index);
  }

  // Hands the slot of the last batch back to the workers (no-op if none).
  void ReleaseHeld() {
    if (held_ >= 0) loader_->Release(held_);
    held_ = -1;
  }

  py::tuple Position() const {
    const LoaderPosition p = loader_->position();
    return py::make_tuple(p.epoch, p.batch);
  }

  const Loader& loader() const { return *loader_; }

  // Batches handed out and seconds spent waiting for them in next(), since
  // the loader was made or the last reset: the data-stall figure of kiln
  // train's report, for a Python loop.
  py::tuple Stats(bool reset) {
    py::tuple t = py::make_tuple(batches_, wait_seconds_);
    if (reset) {
      batches_ = 0;
      wait_seconds_ = 0;
    }
    return t;
  }

 private:
  pid_t pid_;
  std::shared_ptr<PyCache> cache_;
  py::object keepalive_;  // owns the slot memory; outlives loader_
  std::unique_ptr<Loader> loader_;
  int held_ = -1;
  uint64_t batches_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "kiln's C++ cache reader and loader (use the kiln package, not this module)";

  static py::exception<StatusError> corruption(m, "CorruptionError", PyExc_ValueError);
  g_corruption_error = corruption.ptr();
  py::register_exception_translator(&TranslateStatusError);
  m.attr("__version__") = KilnVersion();
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
      .def_property_readonly("shape",
                             [](const PyCache& c) { return ShapeTuple(c.reader()->manifest().shape); })
      .def_property_readonly("dtype",
                             [](const PyCache& c) { return DTypeName(c.reader()->manifest().dtype); })
      .def_property_readonly("record_bytes", [](const PyCache& c) { return c.reader()->record_bytes(); })
      .def_property_readonly("classes", [](const PyCache& c) { return c.reader()->manifest().classes; })
      .def_property_readonly("preprocessing_json",
                             [](const PyCache& c) { return c.reader()->manifest().preprocessing.ToJson(); })
      .def_property_readonly("manifest_json",
                             [](const PyCache& c) { return ManifestToJson(c.reader()->manifest()); })
      .def("get", &PyCache::Get, py::arg("index"), py::arg("verify") = false);

  py::class_<LoaderOptions>(m, "LoaderOptions")
      .def(py::init<>())
      .def_readwrite("batch_size", &LoaderOptions::batch_size)
      .def_readwrite("workers", &LoaderOptions::workers)
      .def_readwrite("shuffle", &LoaderOptions::shuffle)
      .def_readwrite("seed", &LoaderOptions::seed)
      .def_readwrite("drop_last", &LoaderOptions::drop_last)
      .def_readwrite("rank", &LoaderOptions::rank)
      .def_readwrite("world_size", &LoaderOptions::world_size)
      .def_readwrite("crop", &LoaderOptions::crop)
      .def_readwrite("random_crop", &LoaderOptions::random_crop)
      .def_readwrite("random_flip", &LoaderOptions::random_flip)
      .def_readwrite("verify_checksums", &LoaderOptions::verify_checksums);

  py::class_<PyLoader>(m, "Loader")
      .def(py::init<std::shared_ptr<PyCache>, const LoaderOptions&, const std::vector<uintptr_t>&,
                    const std::vector<uintptr_t>&, uint64_t, py::object>(),
           py::arg("cache"), py::arg("options"), py::arg("data"), py::arg("labels"),
           py::arg("slot_bytes"), py::arg("keepalive"))
      .def("start_epoch", &PyLoader::StartEpoch, py::arg("epoch"), py::arg("start_batch") = 0)
      .def("next", &PyLoader::Next)
      .def("release", &PyLoader::ReleaseHeld)
      .def("position", &PyLoader::Position)
      .def("stats", &PyLoader::Stats, py::arg("reset") = false)
      .def_property_readonly("sample_shape",
                             [](const PyLoader& l) { return ShapeTuple(l.loader().sample_shape()); })
      .def_property_readonly("sample_bytes", [](const PyLoader& l) { return l.loader().sample_bytes(); })
      .def_property_readonly("samples_per_epoch",
                             [](const PyLoader& l) { return l.loader().samples_per_epoch(); })
      .def_property_readonly("batches_per_epoch",
                             [](const PyLoader& l) { return l.loader().batches_per_epoch(); })
      .def("epoch_order", [](const PyLoader& l, uint64_t e) { return l.loader().EpochOrder(e); },
           py::arg("epoch"));
}
