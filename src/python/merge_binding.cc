// kiln._kiln.merge and merge_parts: kiln merge's two kinds (kiln::merge,
// src/ingest) for Python; kiln.merge and kiln.ray call them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "binding.h"
#include "kiln/cache_layout.h"
#include "kiln/ingest/build.h"

namespace kiln::python {
namespace {

py::dict ResultDict(const ingest::MergeResult& r) {
  py::dict d;
  d["caches"] = r.caches;
  d["records"] = r.records;
  d["joined"] = r.parts;
  d["shards"] = r.shards;
  d["rewritten_records"] = r.copied_records;
  d["relabelled_records"] = r.relabelled_records;
  d["duplicate_groups"] = r.duplicates.groups;
  d["duplicate_repeats"] = r.duplicates.repeats;
  d["duplicates_file"] = r.duplicates_file;
  d["seconds"] = r.seconds;
  return d;
}

}  // namespace

void BindMerge(py::module_& m) {
  m.def(
      "merge",
      [](const std::string& out, const std::vector<std::string>& from) {
        ingest::MergeResult r;
        Status s;
        {
          py::gil_scoped_release unlocked;
          s = ingest::MergeCaches(out, from, nullptr, &r);
        }
        Check(s);
        return ResultDict(r);
      },
      py::arg("out"), py::arg("caches"),
      "kiln merge --from: the finished caches joined in order into OUT (MergeCaches)");
  m.def(
      "merge_parts",
      [](const std::string& out, const std::vector<std::string>& parts, bool keep_parts) {
        ingest::MergeResult r;
        Status s;
        {
          py::gil_scoped_release unlocked;
          s = ingest::MergeParts(out, parts, keep_parts, nullptr, &r);
        }
        Check(s);
        return ResultDict(r);
      },
      py::arg("out"), py::arg("parts") = std::vector<std::string>(), py::arg("keep_parts") = false,
      "kiln merge OUT [PART...]: the parts of one cache joined into OUT (MergeParts)");
  m.attr("MANIFEST_NAME") = kManifestName;
  m.def("part_dir_name", &PartDirName, py::arg("part"), py::arg("num_parts"),
        "The directory of part `part` (0-based) of `num_parts`: part-IIIII-of-NNNNN");
}

}  // namespace kiln::python
