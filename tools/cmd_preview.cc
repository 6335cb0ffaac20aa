// kiln preview CACHE -o FILE: a labelled contact sheet of a seeded sample.
#include <iostream>
#include <sstream>

#include "command.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "kiln/image/render.h"

namespace kiln::tools {
namespace {

struct PreviewArgs {
  std::string dir, split, out, classes;
  image::PreviewOptions o;
};

int RunPreview(PreviewArgs a) {
  std::stringstream list(a.classes);
  for (std::string name; std::getline(list, name, ',');)
    if (!name.empty()) a.o.classes.push_back(name);
  std::string dir;
  Status s = ResolveSplitDir(a.dir, a.split, &dir);
  std::unique_ptr<CacheReader> reader;
  if (s.ok()) s = CacheReader::Open(dir, ReaderOptions(), &reader);
  std::vector<uint64_t> shown;
  if (s.ok()) s = image::WritePreview(*reader, a.o, a.out, &shown);
  if (!s.ok()) return ReportError("preview", s);
  std::cout << "kiln preview: " << shown.size() << " records of " << dir << " -> " << a.out << "\n";
  return kExitOk;
}

KILN_COMMAND(Command{
    "preview", "Draw a labelled contact sheet of a seeded sample of records", 34,
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<PreviewArgs>();
      sub->add_option("CACHE", a->dir, "cache directory (or the parent of its train/ and val/)")
          ->required();
      sub->add_option("-o,--output", a->out, "image file to write (.png, .jpg, .bmp, ...)")
          ->required();
      sub->add_option("--count", a->o.count, "records to draw (default 16)");
      sub->add_option("--classes", a->classes, "only these classes: NAME[,NAME...]");
      sub->add_option("--seed", a->o.seed, "seed of the sample (default 0)");
      sub->add_option("--split", a->split, "train (default) or val, for a --val-fraction cache");
      AddExamples(sub, {"kiln preview OUT -o grid.png --count 25",
                        "kiln preview OUT --classes sandal,sneaker --seed 3 -o shoes.png"});
      return [a] { return RunPreview(*a); };
    }});

}  // namespace
}  // namespace kiln::tools
