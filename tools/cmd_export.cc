// kiln export CACHE --index I -o FILE: one record as an image file.
#include <iostream>

#include "command.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "kiln/image/render.h"

namespace kiln::tools {
namespace {

struct ExportArgs {
  std::string dir, split, out;
  uint64_t index = 0;
};

int RunExport(const ExportArgs& a) {
  std::string dir;
  Status s = ResolveSplitDir(a.dir, a.split, &dir);
  std::unique_ptr<CacheReader> reader;
  if (s.ok()) s = CacheReader::Open(dir, ReaderOptions(), &reader);
  if (s.ok()) s = image::ExportRecord(*reader, a.index, a.out);
  if (!s.ok()) return ReportError("export", s);
  std::cout << "kiln export: record " << a.index << " of " << dir << " -> " << a.out << "\n";
  return kExitOk;
}

KILN_COMMAND(Command{
    "export", "Write one record as an image (float records de-normalized)", 32,
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<ExportArgs>();
      sub->add_option("CACHE", a->dir, "cache directory (or the parent of its train/ and val/)")
          ->required();
      sub->add_option("--index", a->index, "the record's index")->required();
      sub->add_option("-o,--output", a->out, "image file to write (.png, .jpg, .bmp, ...)")
          ->required();
      sub->add_option("--split", a->split, "train (default) or val, for a --val-fraction cache");
      AddExamples(sub, {"kiln export OUT --index 0 -o sample.png",
                        "kiln export OUT --split val --index 17 -o val17.png"});
      return [a] { return RunExport(*a); };
    }});

}  // namespace
}  // namespace kiln::tools
