// sources.tsv: read and written here only (build, merge, verify sources).
#include "sources_tsv.h"

#include <fstream>
#include <sstream>

#include "kiln/escape.h"
#include "kiln/file.h"

namespace kiln::ingest {

std::string RawName(const std::string& text) {
  std::string raw;
  return UnescapeName(text, &raw) ? raw : text;
}

Status ReadSourcesTsv(const std::string& path, std::vector<RecordedSource>* out) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": missing (the cache was not made by kiln build)");
  std::string line;
  std::getline(in, line);  // header
  int lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    std::vector<std::string> f;
    size_t pos = 0, tab;
    while ((tab = line.find('\t', pos)) != std::string::npos) {
      f.push_back(line.substr(pos, tab - pos));
      pos = tab + 1;
    }
    f.push_back(line.substr(pos));
    if (f.size() != 5)
      return Status::Corruption(path + ":" + std::to_string(lineno) + ": bad line");
    RecordedSource r;
    try {
      r.record = std::stoll(f[0]);
      if (!UnescapeName(f[1], &r.item.rel_path))
        return Status::Corruption(path + ":" + std::to_string(lineno) + ": bad escape in the path");
      r.item.label = std::stoll(f[2]);
      r.item.size = std::stoull(f[3]);
      r.item.mtime_ns = std::stoll(f[4]);
    } catch (...) {
      return Status::Corruption(path + ":" + std::to_string(lineno) + ": bad number");
    }
    out->push_back(std::move(r));
  }
  return Status::OK();
}

Status WriteSourcesTsv(const std::string& path, const std::vector<RecordedSource>& sources) {
  std::string out = "record\tpath\tlabel\tsize\tmtime_ns\n";
  for (const RecordedSource& r : sources) {
    const SourceItem& it = r.item;
    out += std::to_string(r.record) + "\t" + EscapeName(it.rel_path) + "\t" + std::to_string(it.label) + "\t" +
           std::to_string(it.size) + "\t" + std::to_string(it.mtime_ns) + "\n";
  }
  // Written in full and fsynced before it is renamed into place.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name = path.substr(slash + 1);
  return WriteFileAtomic(dir, name, name + ".tmp", out);
}

}  // namespace kiln::ingest
