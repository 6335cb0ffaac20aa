// kiln._kiln.Writer: a format 2 cache written from Python, one sample (a
// dict of arrays) at a time, over kiln::CacheWriter. The package's
// kiln.Writer (python/kiln/writer.py) is a thin skin over it: every check
// of a sample against the declared fields is made here, once.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ingest/duplicate_report.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "kiln/manifest.h"
#include "python/binding.h"

namespace kiln::python {

namespace {

using nlohmann::json;

// The field declarations Python passes: (name, dtype name, shape) with
// None for a variable dim.
std::vector<FieldSpec> ParseFields(const py::list& fields) {
  std::vector<FieldSpec> out;
  for (const py::handle& item : fields) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 3 && t.size() != 4)
      throw std::invalid_argument("kiln.Writer: a field is (name, dtype, shape[, codec])");
    FieldSpec spec;
    spec.name = t[0].cast<std::string>();
    if (t.size() == 4 && !t[3].is_none()) {
      const std::string codec = t[3].cast<std::string>();
      if (codec == CodecName(Codec::kJpeg))
        spec.codec = Codec::kJpeg;
      else if (codec != CodecName(Codec::kRaw))
        throw std::invalid_argument("kiln.Writer: field '" + spec.name + "': codec '" + codec +
                                    "' (expected 'jpeg', or None for raw)");
    }
    Check(ParseDType(t[1].cast<std::string>(), &spec.dtype)
              .WithContext("kiln.Writer: field '" + spec.name + "'"));
    const py::tuple shape = py::reinterpret_borrow<py::tuple>(t[2]);
    if (shape.size() > static_cast<size_t>(kMaxDims))
      throw std::invalid_argument("kiln.Writer: field '" + spec.name + "' has " +
                                  std::to_string(shape.size()) + " dims, at most " +
                                  std::to_string(kMaxDims));
    spec.ndim = static_cast<int>(shape.size());
    for (int i = 0; i < spec.ndim; ++i) {
      if (shape[i].is_none()) {
        spec.dims[i] = FieldSpec::kVariableDim;
      } else {
        const int64_t d = shape[i].cast<int64_t>();
        if (d < 1)
          throw std::invalid_argument("kiln.Writer: field '" + spec.name +
                                      "': a fixed dim must "
                                      "be at least 1 (None for one that varies), not " +
                                      std::to_string(d));
        spec.dims[i] = d;
      }
    }
    out.push_back(spec);
  }
  return out;
}

// The label field a writer uses when Python names none: "label" when it is
// an int64/int32 scalar, else none.
std::string DefaultLabelField(const std::vector<FieldSpec>& fields) {
  for (const FieldSpec& f : fields)
    if (f.name == "label" && f.ndim == 0 && (f.dtype == DType::kInt64 || f.dtype == DType::kInt32))
      return f.name;
  return "";
}

bool SameNumpyType(const py::dtype& got, DType want) {
  return got.is(py::dtype(NumpyDType(want))) || got.equal(py::dtype(NumpyDType(want)));
}

class PyWriter {
 public:
  PyWriter(const std::string& path, const py::list& fields, const py::object& label_field,
           std::vector<std::string> classes, std::vector<double> mean, std::vector<double> std,
           const std::string& source_json, uint64_t shard_size, bool resume, bool append,
           const std::string& append_from, std::vector<int64_t> part)
      : path_(path) {
    WriterOptions o;
    // (index, count, first): part `index` of `count` of a cache written in
    // parts, its records the global indices first.. (kiln.ray).
    if (!part.empty()) {
      if (part.size() != 3 || part[1] < 1 || part[0] < 0 || part[0] >= part[1] || part[2] < 0 ||
          append)
        throw std::invalid_argument(
            "kiln.Writer: part is (index, count, first) with 0 <= index < count and first >= 0, "
            "and not with mode='append'");
      o.first_index = static_cast<uint64_t>(part[2]);
      meta_.part_index = static_cast<int>(part[0]);
      meta_.part_count = static_cast<int>(part[1]);
    }
    o.fields = ParseFields(fields);
    o.label_field =
        label_field.is_none() ? DefaultLabelField(o.fields) : label_field.cast<std::string>();
    o.shard_size = shard_size;
    o.resume = resume;
    o.append = append;
    o.append_from = append_from;
    // Checked before the directory is touched.
    int image = 0, label = -1;
    Check(CheckFieldSpecs(o.fields, o.label_field, "kiln.Writer(" + path + ")", &image, &label));
    if (!mean.empty() || !std.empty()) {
      const FieldSpec& im = o.fields[image];
      const size_t channels = im.ndim == 3 && im.dims[0] > 0 ? static_cast<size_t>(im.dims[0]) : 1;
      if (mean.size() != channels || std.size() != channels)
        throw std::invalid_argument("kiln.Writer: mean and std need one value per channel of '" +
                                    im.name + "' (" + std::to_string(channels) + ")");
      for (double s : std)
        if (!(s > 0)) throw std::invalid_argument("kiln.Writer: std must be positive");
    }
    fields_ = o.fields;
    encoded_.resize(fields_.size());
    label_index_ = label;
    meta_.classes = std::move(classes);
    // What the manifest records of who wrote the cache and from what: the
    // writer, the caller's source description (dataset class, recipe), and
    // a uint8 image's mean/std, which loaders normalize with.
    json p = json::parse(source_json.empty() ? "{}" : source_json, nullptr, false);
    if (!p.is_object())
      throw std::invalid_argument("kiln.Writer: the source description is not a JSON object");
    p["writer"] = std::string("kiln.Writer ") + KilnVersion();
    if (!mean.empty()) {
      p["mean"] = mean;
      p["std"] = std;
    }
    // Appending keeps the cache's recipe (the writer checks a given mean and
    // std against it) and its classes, unless new ones are given.
    if (!append || !mean.empty())
      Check(Preprocessing::FromJson(p.dump(), "kiln.Writer", &meta_.preprocessing));
    Check(CacheWriter::Open(o, path, &writer_));
    // A whole cache gets OUT/duplicates.tsv when it is finished, as kiln
    // build's does (a part's are found when the parts are merged). An
    // append's report covers old and new records: the old one goes now, so
    // that a cache is never left with a report of fewer records than it holds.
    report_duplicates_ = part.empty();
    if (append) std::remove((path + "/" + kDuplicatesTsvName).c_str());
    if (append && meta_.classes.empty()) {
      Manifest base;
      Check(ReadManifest(path, &base));
      meta_.classes = base.classes;
    }
  }

  uint64_t NextIndex() const { return writer_ ? writer_->next_index() : 0; }
  uint64_t AppendBase() const { return writer_ ? writer_->append_base() : 0; }

  // Appends one sample; returns its index. Every declared field must be in
  // `sample` (and nothing else), as an array of the declared dtype, or a
  // Python number, which takes the declared dtype.
  uint64_t Append(const py::dict& sample) {
    if (!writer_) throw std::runtime_error("kiln.Writer: already closed");
    const uint64_t index = writer_->next_index();
    auto where = [&](const std::string& field) {
      return "kiln.Writer(" + path_ + "): record " + std::to_string(index) + ", field '" + field +
             "'";
    };
    for (const auto& item : sample) {
      const std::string key = py::str(item.first);
      bool declared = false;
      for (const FieldSpec& f : fields_) declared = declared || f.name == key;
      if (!declared) throw std::invalid_argument(where(key) + ": not a declared field");
    }
    const py::module_& np = numpy_;
    std::vector<py::array> arrays;
    std::vector<FieldData> data(fields_.size());
    for (size_t f = 0; f < fields_.size(); ++f) {
      const FieldSpec& spec = fields_[f];
      if (!sample.contains(spec.name.c_str()))
        throw std::invalid_argument(where(spec.name) + ": missing from the sample");
      py::object value = sample[spec.name.c_str()];
      if (spec.codec == Codec::kJpeg) {
        // bytes-like: a JPEG, stored as it is (checked to decode, with the
        // field's channels and sizes); an array: the C x H x W image, encoded.
        std::vector<uint8_t>& jpeg = encoded_[f];
        Shape shape;
        Status st;
        if (py::isinstance<py::bytes>(value) || py::isinstance<py::bytearray>(value) ||
            py::isinstance<py::memoryview>(value)) {
          const std::string b = py::isinstance<py::bytes>(value)
                                    ? value.cast<std::string>()
                                    : py::bytes(value).cast<std::string>();
          jpeg.assign(b.begin(), b.end());
          st = CheckJpegForField(spec, jpeg.data(), jpeg.size(), &shape);
        } else {
          if (py::hasattr(value, "detach") && py::hasattr(value, "cpu"))
            value = value.attr("detach")().attr("cpu")();
          py::array a = np.attr("ascontiguousarray")(value);
          if (!SameNumpyType(a.dtype(), DType::kUint8) || a.ndim() != 3)
            throw std::invalid_argument(where(spec.name) +
                                        ": a JPEG field takes the JPEG's bytes, or a uint8 C x H "
                                        "x W image to encode");
          shape.ndim = 3;
          for (int i = 0; i < 3; ++i) shape.dims[i] = static_cast<uint32_t>(a.shape(i));
          if (!spec.Admits(DType::kUint8, shape, Codec::kJpeg))
            throw std::invalid_argument(where(spec.name) + ": shape " +
                                        py::str(a.attr("shape")).cast<std::string>() +
                                        ", declared " + spec.ShapeText());
          st = EncodeJpegCHW(static_cast<const uint8_t*>(a.data()), shape, kDefaultJpegQuality,
                             &jpeg);
        }
        if (!st.ok()) throw std::invalid_argument(where(spec.name) + ": " + st.message());
        data[f] = {DType::kUint8, shape, jpeg.data(), Codec::kJpeg, jpeg.size()};
        continue;
      }
      const bool number = py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value) ||
                          py::isinstance<py::bool_>(value);
      py::array a;
      if (number) {
        a = np.attr("asarray")(value, py::dtype(NumpyDType(spec.dtype)));
      } else {
        // torch tensors (on the CPU) and other array-likes, as numpy sees them.
        if (py::hasattr(value, "detach") && py::hasattr(value, "cpu"))
          value = value.attr("detach")().attr("cpu")();
        // asarray, not ascontiguousarray: that one makes a 0-d array 1-d.
        a = np.attr("asarray")(value);
        if (!(a.flags() & py::array::c_style)) a = np.attr("ascontiguousarray")(a);
        if (!SameNumpyType(a.dtype(), spec.dtype))
          throw std::invalid_argument(where(spec.name) + ": dtype " +
                                      py::str(a.dtype()).cast<std::string>() + ", declared " +
                                      DTypeName(spec.dtype));
      }
      if (a.ndim() != spec.ndim)
        throw std::invalid_argument(where(spec.name) + ": " + std::to_string(a.ndim()) +
                                    " dims, declared " + spec.ShapeText());
      Shape shape;
      shape.ndim = spec.ndim;
      for (int i = 0; i < spec.ndim; ++i) {
        const py::ssize_t d = a.shape(i);
        if (d < 0 || static_cast<uint64_t>(d) > UINT32_MAX ||
            (spec.dims[i] != FieldSpec::kVariableDim && d != spec.dims[i]))
          throw std::invalid_argument(where(spec.name) + ": shape " +
                                      py::str(a.attr("shape")).cast<std::string>() + ", declared " +
                                      spec.ShapeText() + " (? is a dim that may vary)");
        shape.dims[i] = static_cast<uint32_t>(d);
      }
      if (static_cast<int>(f) == label_index_ && !meta_.classes.empty()) {
        const int64_t v = spec.dtype == DType::kInt64 ? *static_cast<const int64_t*>(a.data())
                                                      : *static_cast<const int32_t*>(a.data());
        if (v < 0 || v >= static_cast<int64_t>(meta_.classes.size()))
          throw std::invalid_argument(where(spec.name) + ": " + std::to_string(v) +
                                      " is outside the " + std::to_string(meta_.classes.size()) +
                                      " classes");
      }
      data[f] = {spec.dtype, shape, a.data()};
      arrays.push_back(std::move(a));  // keeps the bytes alive while writing
    }
    Status s;
    {
      py::gil_scoped_release unlocked;
      s = writer_->AppendFields(index, data.data(), static_cast<int>(data.size()));
    }
    Check(s.WithContext("kiln.Writer(" + path_ + ")"));
    return index;
  }

  // Finishes the cache: commits, syncs and writes the manifest (until then
  // the directory is an incomplete cache). Returns the manifest's JSON.
  std::string Close() {
    if (!writer_) throw std::runtime_error("kiln.Writer: already closed");
    Status s;
    {
      py::gil_scoped_release unlocked;
      s = writer_->Finish(&meta_);
      writer_.reset();
      // The records' fingerprints, the old shards' kept from the last
      // report (.fingerprints/): an append hashes only its own records.
      if (s.ok() && report_duplicates_)
        s = ingest::ReportDuplicates(path_, {{"", path_}}, 0, &duplicates_)
                .WithContext("kiln.Writer(" + path_ + "): the cache is finished, but its "
                             "duplicate report (" + kDuplicatesTsvName + ") could not be written");
    }
    Check(s);
    reported_ = report_duplicates_;
    return ManifestToJson(meta_);
  }

  // After close(): what OUT/duplicates.tsv reports, or None (a part).
  py::object Duplicates() const {
    if (!reported_) return py::none();
    py::dict d;
    d["groups"] = duplicates_.groups;
    d["repeats"] = duplicates_.repeats;
    d["label_conflicts"] = duplicates_.label_conflicts;
    return d;
  }

  // Drops the writer without a manifest: what was committed stays, for a
  // resume; the directory stays an incomplete cache.
  void Abandon() { writer_.reset(); }

  bool closed() const { return !writer_; }

 private:
  std::string path_;
  py::module_ numpy_ = py::module_::import("numpy");  // once, not per sample
  std::vector<FieldSpec> fields_;
  std::vector<std::vector<uint8_t>> encoded_;  // per field: a JPEG field's bytes, for one Append
  int label_index_ = -1;  // the label field, or -1
  Manifest meta_;
  std::unique_ptr<CacheWriter> writer_;
  bool report_duplicates_ = false;  // not a part
  bool reported_ = false;           // close() wrote duplicates.tsv
  DuplicateCounts duplicates_;
};

}  // namespace

py::list FieldsList(const Manifest& m) {
  py::list out;
  for (const FieldSpec& f : m.fields) {
    py::list shape, max_shape;
    for (int i = 0; i < f.ndim; ++i) {
      shape.append(f.dims[i] == FieldSpec::kVariableDim ? py::object(py::none())
                                                        : py::object(py::int_(f.dims[i])));
      max_shape.append(f.max_dims[i]);
    }
    out.append(py::make_tuple(f.name, DTypeName(f.dtype), py::tuple(shape), py::tuple(max_shape),
                              f.codec == Codec::kRaw ? py::object(py::none())
                                                     : py::object(py::str(CodecName(f.codec)))));
  }
  return out;
}

void BindWriter(py::module_& m) {
  py::class_<PyWriter>(m, "Writer")
      .def(
          py::init<const std::string&, const py::list&, const py::object&, std::vector<std::string>,
                   std::vector<double>, std::vector<double>, const std::string&, uint64_t, bool,
                   bool, const std::string&, std::vector<int64_t>>(),
          py::arg("path"), py::arg("fields"), py::arg("label_field"), py::arg("classes"),
          py::arg("mean"), py::arg("std"), py::arg("source_json"), py::arg("shard_size"),
          py::arg("resume"), py::arg("append") = false, py::arg("append_from") = "",
          py::arg("part") = std::vector<int64_t>())
      .def("append", &PyWriter::Append, py::arg("sample"))
      .def("close", &PyWriter::Close)
      .def("abandon", &PyWriter::Abandon)
      .def_property_readonly("closed", &PyWriter::closed)
      .def_property_readonly("next_index", &PyWriter::NextIndex)
      .def_property_readonly("append_base", &PyWriter::AppendBase)
      .def_property_readonly("duplicates", &PyWriter::Duplicates);
}

}  // namespace kiln::python
