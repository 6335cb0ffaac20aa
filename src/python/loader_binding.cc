// kiln._kiln.Loader: the C++ loader (kiln::Loader) over slots the Python
// package allocates (python/kiln/loader.py), its options, and the geometry
// functions the package asks before it allocates them (see kiln_module.cc
// for the module's rules on fork() and errors).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/loader.h"
#include "python/binding.h"

namespace kiln::python {
namespace {

// kiln::Loader over caller-owned slots given as addresses, and the
// position the Python iterator starts from.
//
// Slots and copies. The batch next() returned last is the caller's
// ("current") until the caller takes another, hands it back, or an epoch
// starts. A caller whose batch may still be read by an asynchronous copy
// (pin_memory=True with x.cuda(non_blocking=True), or the loader's own
// device copies) hands it back with a fence: an object with query() (has
// the copy finished? never blocks) and synchronize() (waits for it), such
// as a torch.cuda.Event recorded after the copy was queued. The slot then
// waits, "pending", and goes back to the workers only once its fence says
// the copy finished: each next() polls the pending fences, and when the
// batch next() wants must go into a slot still pending, next() waits on
// that slot's fence (counted as waiting for data). No slot is refilled
// while a copy may still read it.
class PyLoader {
 public:
  PyLoader(std::shared_ptr<PyCache> cache, const LoaderOptions& options,
           const std::vector<uintptr_t>& data, const std::vector<uintptr_t>& labels,
           uint64_t slot_bytes, py::object keepalive, const std::vector<uintptr_t>& boxes,
           const std::vector<std::vector<std::pair<uintptr_t, uintptr_t>>>& fields)
      : pid_(getpid()), cache_(std::move(cache)), keepalive_(std::move(keepalive)) {
    CheckSameProcess(cache_->pid(), "the kiln.Cache given to this Loader");
    if (data.empty() || data.size() != labels.size() ||
        (!boxes.empty() && boxes.size() != data.size()))
      throw std::invalid_argument(
          "kiln.Loader: need as many label (and box) buffers as data buffers (" +
          std::to_string(data.size()) + " vs " + std::to_string(labels.size()) + ")");
    uint64_t need = 0;
    Check(LoaderSlotBytes(cache_->reader()->manifest(), options, &need));
    if (slot_bytes < need)
      throw std::invalid_argument("kiln.Loader: slots of " + std::to_string(slot_bytes) +
                                  " bytes, a batch needs " + std::to_string(need));
    if (!fields.empty() && fields.size() != data.size())
      throw std::invalid_argument("kiln.Loader: need field buffers for every slot");
    std::vector<BatchSlot> slots;
    for (size_t i = 0; i < data.size(); ++i) {
      BatchSlot slot;
      slot.data = reinterpret_cast<void*>(data[i]);
      slot.labels = reinterpret_cast<int64_t*>(labels[i]);
      slot.boxes = boxes.empty() ? nullptr : reinterpret_cast<int64_t*>(boxes[i]);
      slots.push_back(std::move(slot));
      if (!fields.empty())
        for (const auto& [d, l] : fields[i])
          slots.back().fields.push_back(
              {reinterpret_cast<void*>(d), reinterpret_cast<int64_t*>(l)});
    }
    slots_ = slots.size();
    Check(Loader::Open(cache_->reader(), options, std::move(slots), &loader_));
  }

  // The output size for the next epochs (a resolution schedule): every
  // slot back first, as at Start.
  void SetResolution(uint32_t crop) {
    CheckSameProcess(pid_, "this kiln.Loader");
    HandBack(py::none());
    WaitAllPending();
    Check(loader_->SetResolution(crop));
  }
  ~PyLoader() {
    if (getpid() != pid_) {  // see fork() above
      (void)loader_.release();
      return;
    }
    try {
      // A copy still reading a slot must finish before the ring goes. The
      // batch handed out last is not handed back: the workers stop without
      // refilling it, so its tensors stay valid after the loader is gone
      // (x, y = next(iter(kiln.Loader(...))) with a temporary loader).
      WaitAllPending();
    } catch (const py::error_already_set&) {
    }
    py::gil_scoped_release unlocked;  // joining may wait for a worker's fill
    loader_.reset();
  }

  // Starts the epoch at the loader's position (set_position), with every
  // slot back from the caller and from pending copies.
  void Start() {
    CheckSameProcess(pid_, "this kiln.Loader");
    HandBack(py::none());
    WaitAllPending();
    Status s;
    {
      py::gil_scoped_release unlocked;
      s = loader_->StartEpoch(epoch_, batch_, skip_);
    }
    Check(s);
    started_epoch_ = epoch_;
  }

  // (slot, size, epoch, index) of the next batch, or None at the end of the
  // epoch, after which the position is the next epoch's start. The current
  // batch is handed back first, with `fence` (None: at once). Raises the
  // error of a record that failed to load (again on every call until Start).
  py::object Next(py::object fence) {
    CheckSameProcess(pid_, "this kiln.Loader");
    HandBack(std::move(fence));
    PollPending();
    double waited = 0;
    // The batch wanted goes into slot (its number % slots): if a copy may
    // still read that slot, wait for it.
    const LoaderPosition at = loader_->position();
    const int wanted = static_cast<int>(at.batch % slots_);
    if (pending_.count(wanted)) {
      const auto t0 = std::chrono::steady_clock::now();
      WaitPending(wanted);
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    Batch b;
    Status s;
    {
      py::gil_scoped_release unlocked;
      const auto t0 = std::chrono::steady_clock::now();
      s = loader_->Next(&b);
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    wait_seconds_ += waited;
    if (s.IsNotFound()) return py::none();
    Check(s);
    ++batches_;
    current_ = b.slot;
    return py::make_tuple(b.slot, b.size, b.epoch, b.index);
  }

  // The current batch goes back to the workers: at once (fence None), or
  // once `fence` says the copy reading it has finished.
  void HandBack(py::object fence) {
    if (current_ < 0) return;
    const int slot = current_;
    current_ = -1;
    if (fence.is_none() && !fence_maker_.is_none()) fence = fence_maker_();
    if (fence.is_none()) {
      loader_->Release(slot);
    } else {
      pending_[slot] = std::move(fence);
    }
  }

  // Where the next iteration starts: (epoch, batch). The iterator reports
  // each batch it yields (a batch yielded counts as consumed) and the end
  // of its epoch; the loader itself may be ahead of it (device copies).
  // (epoch, batch, skip, consumed): see kiln::LoaderPosition.
  py::tuple Position() const {
    return py::make_tuple(epoch_, batch_, skip_, loader_->Consumed(skip_, batch_));
  }
  void SetPosition(uint64_t epoch, uint64_t batch, uint64_t skip) {
    epoch_ = epoch;
    batch_ = batch;
    skip_ = skip;
  }
  void Yielded(uint64_t epoch, uint64_t index) { SetPosition(epoch, index + 1, skip_); }
  void EpochDone() { SetPosition(started_epoch_ + 1, 0, 0); }
  // A callable making a fence for every batch handed back without one
  // (pin_memory=True: a CUDA event recorded on the current stream, since
  // the caller may have queued a copy of it). None: hand back at once.
  void SetFenceMaker(py::object maker) { fence_maker_ = std::move(maker); }
  size_t pending() const { return pending_.size(); }

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
  // Releases every pending slot whose copy has finished.
  void PollPending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.attr("query")().cast<bool>()) {
        loader_->Release(it->first);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Waits for slot's copy (torch's synchronize() lets go of the GIL while
  // it waits), then releases the slot.
  void WaitPending(int slot) {
    auto it = pending_.find(slot);
    if (it == pending_.end()) return;
    py::object fence = std::move(it->second);
    pending_.erase(it);
    fence.attr("synchronize")();
    loader_->Release(slot);
  }
  void WaitAllPending() {
    while (!pending_.empty()) WaitPending(pending_.begin()->first);
  }

  pid_t pid_;
  std::shared_ptr<PyCache> cache_;
  py::object keepalive_;  // owns the slot memory; outlives loader_
  std::unique_ptr<Loader> loader_;
  size_t slots_ = 0;
  int current_ = -1;  // the slot of the batch last handed out, still the caller's
  // Slots handed back with a fence whose copy may still be reading them.
  std::map<int, py::object> pending_;
  py::object fence_maker_ = py::none();
  uint64_t epoch_ = 0, batch_ = 0, skip_ = 0;  // where the next Start() begins
  uint64_t started_epoch_ = 0;
  uint64_t batches_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace

void BindLoader(py::module_& m) {
  m.def(
      "resolution_at",
      [](const std::string& schedule, int64_t epoch) {
        ResolutionSchedule s;
        Check(ParseResolutionSchedule(schedule, &s));
        return ResolutionAt(s, epoch);
      },
      py::arg("schedule"), py::arg("epoch"),
      "The crop size of `epoch` under a resolution schedule MIN:MAX:START:END[:STEP]");
  m.def(
      "output_shape",
      [](const std::shared_ptr<PyCache>& cache, const LoaderOptions& o) {
        Shape shape;
        Check(LoaderOutputShape(cache->reader()->manifest(), o, &shape));
        return ShapeTuple(shape);
      },
      py::arg("cache"), py::arg("options"),
      "The shape of one sample a Loader with these options yields from this cache");
  m.def(
      "output_dtype",
      [](const std::shared_ptr<PyCache>& cache, const LoaderOptions& o) {
        DType dtype;
        Check(LoaderOutputDType(cache->reader()->manifest(), o, &dtype));
        return std::string(DTypeName(dtype));
      },
      py::arg("cache"), py::arg("options"),
      "The element type (a kiln dtype name) of the samples a Loader with these options yields");
  m.def(
      "loader_fields",
      [](const std::shared_ptr<PyCache>& cache, const LoaderOptions& o) {
        std::vector<LoaderField> fields;
        Check(LoaderFields(cache->reader()->manifest(), o, &fields));
        py::list out;
        for (const LoaderField& f : fields) {
          py::list variable;
          for (int k = 0; k < f.variable_dims; ++k) variable.append(f.variable[k]);
          py::dict d;
          d["name"] = f.name;
          d["dtype"] = std::string(DTypeName(f.dtype));
          d["shape"] = ShapeTuple(f.shape);
          d["variable"] = variable;
          d["role"] = f.role == LoaderField::kMask    ? "mask"
                      : f.role == LoaderField::kBoxes ? "boxes"
                                                      : "plain";
          d["sample_bytes"] = f.sample_bytes;
          out.append(d);
        }
        return out;
      },
      py::arg("cache"), py::arg("options"),
      "The other fields a Loader with these options delivers (kiln::LoaderFields): name, dtype, "
      "padded shape, variable dims, role, bytes per sample");
  m.def(
      "slot_bytes",
      [](const std::shared_ptr<PyCache>& cache, const LoaderOptions& o) {
        uint64_t bytes = 0;
        Check(LoaderSlotBytes(cache->reader()->manifest(), o, &bytes));
        return bytes;
      },
      py::arg("cache"), py::arg("options"),
      "The bytes one batch slot needs (batch_size samples at max_crop)");
  m.def(
      "random_resized_crop_boxes",
      [](int height, int width, uint64_t n, uint64_t seed, double scale_min, double scale_max,
         double ratio_min, double ratio_max) {
        RandomResizedCropParams p{scale_min, scale_max, ratio_min, ratio_max};
        Check(CheckRandomResizedCrop(p));
        if (height < 1 || width < 1) throw std::invalid_argument("image size must be >= 1");
        py::array_t<int64_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(5)});
        int64_t* o = out.mutable_data();
        for (uint64_t i = 0; i < n; ++i) {
          SampleRandom random = SampleRandom::For(seed, 0, i);
          bool fallback = false;
          const CropBox b = RandomResizedCropBox(height, width, p, &random, &fallback);
          int64_t* r = o + i * 5;
          r[0] = b.top, r[1] = b.left, r[2] = b.height, r[3] = b.width, r[4] = fallback;
        }
        return out;
      },
      py::arg("height"), py::arg("width"), py::arg("n"), py::arg("seed"), py::arg("scale_min"),
      py::arg("scale_max"), py::arg("ratio_min"), py::arg("ratio_max"),
      "n boxes (top, left, height, width, 1 when the central fallback was taken) as the "
      "loader's RandomResizedCrop draws them for samples 0..n-1 of epoch 0: kiln's "
      "RandomResizedCrop.get_params, for tests against torchvision");

  py::class_<LoaderOptions>(m, "LoaderOptions")
      .def(py::init<>())
      .def("__copy__", [](const LoaderOptions& o) { return o; })
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
      .def_readwrite("verify_checksums", &LoaderOptions::verify_checksums)
      .def_readwrite("readahead_bytes", &LoaderOptions::readahead_bytes)
      .def_readwrite("dct_scaling", &LoaderOptions::dct_scaling)
      .def_readwrite("resize", &LoaderOptions::resize)
      .def_readwrite("max_crop", &LoaderOptions::max_crop)
      .def_property(
          "crop_kind",
          [](const LoaderOptions& o) {
            return std::string(o.crop_kind == CropKind::kRandomResized  ? "random_resized"
                               : o.crop_kind == CropKind::kResizeCenter ? "resize_center"
                                                                        : "window");
          },
          [](LoaderOptions& o, const std::string& kind) {
            if (kind == "window")
              o.crop_kind = CropKind::kWindow;
            else if (kind == "random_resized")
              o.crop_kind = CropKind::kRandomResized;
            else if (kind == "resize_center")
              o.crop_kind = CropKind::kResizeCenter;
            else
              throw std::invalid_argument("crop_kind: window, random_resized or resize_center");
          })
      .def_property(
          "scale",
          [](const LoaderOptions& o) { return py::make_tuple(o.rrc.scale_min, o.rrc.scale_max); },
          [](LoaderOptions& o, std::pair<double, double> v) {
            o.rrc.scale_min = v.first;
            o.rrc.scale_max = v.second;
          })
      .def_property(
          "ratio",
          [](const LoaderOptions& o) { return py::make_tuple(o.rrc.ratio_min, o.rrc.ratio_max); },
          [](LoaderOptions& o, std::pair<double, double> v) {
            o.rrc.ratio_min = v.first;
            o.rrc.ratio_max = v.second;
          })
      .def_property(
          "output_dtype",
          [](const LoaderOptions& o) -> py::object {
            if (!o.output_dtype) return py::none();
            return py::str(DTypeName(*o.output_dtype));
          },
          [](LoaderOptions& o, py::object name) {
            if (name.is_none()) {
              o.output_dtype.reset();
              return;
            }
            DType d;
            Check(ParseDType(name.cast<std::string>(), &d));
            o.output_dtype = d;
          });
  m.attr("AUTO_READAHEAD") = kAutoReadAhead;

  py::class_<PyLoader>(m, "Loader")
      .def(py::init<std::shared_ptr<PyCache>, const LoaderOptions&, const std::vector<uintptr_t>&,
                    const std::vector<uintptr_t>&, uint64_t, py::object,
                    const std::vector<uintptr_t>&,
                    const std::vector<std::vector<std::pair<uintptr_t, uintptr_t>>>&>(),
           py::arg("cache"), py::arg("options"), py::arg("data"), py::arg("labels"),
           py::arg("slot_bytes"), py::arg("keepalive"), py::arg("boxes") = std::vector<uintptr_t>(),
           py::arg("fields") = std::vector<std::vector<std::pair<uintptr_t, uintptr_t>>>())
      .def("set_resolution", &PyLoader::SetResolution, py::arg("crop"))
      .def("start", &PyLoader::Start)
      .def("next", &PyLoader::Next, py::arg("fence") = py::none())
      .def("hand_back", &PyLoader::HandBack, py::arg("fence") = py::none())
      .def("position", &PyLoader::Position)
      .def("set_position", &PyLoader::SetPosition, py::arg("epoch"), py::arg("batch"),
           py::arg("skip") = 0)
      .def("yielded", &PyLoader::Yielded, py::arg("epoch"), py::arg("index"))
      .def("epoch_done", &PyLoader::EpochDone)
      .def("set_fence_maker", &PyLoader::SetFenceMaker, py::arg("maker"))
      .def_property_readonly("pending", &PyLoader::pending)
      .def("stats", &PyLoader::Stats, py::arg("reset") = false)
      .def_property_readonly("readahead_bytes",
                             [](const PyLoader& l) { return l.loader().readahead_bytes(); })
      .def_property_readonly(
          "sample_shape", [](const PyLoader& l) { return ShapeTuple(l.loader().sample_shape()); })
      .def_property_readonly("sample_bytes",
                             [](const PyLoader& l) { return l.loader().sample_bytes(); })
      .def_property_readonly("samples_per_epoch",
                             [](const PyLoader& l) { return l.loader().samples_per_epoch(); })
      .def_property_readonly("batches_per_epoch",
                             [](const PyLoader& l) { return l.loader().batches_per_epoch(); })
      .def(
          "epoch_order",
          [](const PyLoader& l, uint64_t e, uint64_t skip) {
            return l.loader().EpochOrder(e, skip);
          },
          py::arg("epoch"), py::arg("skip") = 0);
}

}  // namespace kiln::python
