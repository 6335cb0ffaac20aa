// sources.tsv: read and written here only (build, merge, verify sources).
#include "sources_tsv.h"

#include <sstream>
#include <string_view>

#include "core/decimal.h"
#include "core/escape.h"
#include "core/file.h"

namespace kiln::ingest {

std::string RawName(const std::string& text) {
  std::string raw;
  return UnescapeName(text, &raw) ? raw : text;
}

Status ReadSourcesTsv(const std::string& path, std::vector<RecordedSource>* out) {
  std::string text;
  const Status s = ReadWholeFile(path, &text);
  if (s.IsNotFound())
    return Status::NotFound(path + ": missing (the cache was not made by kiln build)");
  KILN_RETURN_IF_ERROR(s);
  return ParseSourcesTsv(text, path, out);
}

Status ParseSourcesTsv(const std::string& text, const std::string& where,
                       std::vector<RecordedSource>* out) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // header
  int lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string at = where + ":" + std::to_string(lineno);
    std::vector<std::string_view> f;
    const std::string_view rest(line);
    size_t pos = 0, tab;
    while ((tab = rest.find('\t', pos)) != std::string_view::npos) {
      f.push_back(rest.substr(pos, tab - pos));
      pos = tab + 1;
    }
    f.push_back(rest.substr(pos));
    if (f.size() != 5) return Status::Corruption(at + ": bad line");
    RecordedSource r;
    if (!UnescapeName(std::string(f[1]), &r.item.rel_path))
      return Status::Corruption(at + ": bad escape in the path");
    if (!ParseDecimal(f[0], &r.record) || r.record < -1 || !ParseDecimal(f[2], &r.item.label) ||
        !ParseDecimal(f[3], &r.item.size) || !ParseDecimal(f[4], &r.item.mtime_ns))
      return Status::Corruption(at + ": bad number");
    out->push_back(std::move(r));
  }
  return Status::OK();
}

std::string FormatSourcesTsv(const std::vector<RecordedSource>& sources) {
  std::string out = "record\tpath\tlabel\tsize\tmtime_ns\n";
  for (const RecordedSource& r : sources) {
    const SourceItem& it = r.item;
    out += std::to_string(r.record) + "\t" + EscapeName(it.rel_path) + "\t" +
           std::to_string(it.label) + "\t" + std::to_string(it.size) + "\t" +
           std::to_string(it.mtime_ns) + "\n";
  }
  return out;
}

Status WriteSourcesTsv(const std::string& path, const std::vector<RecordedSource>& sources) {
  const std::string out = FormatSourcesTsv(sources);
  // Written in full and fsynced before it is renamed into place.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name = path.substr(slash + 1);
  return WriteFileAtomic(dir, name, name + ".tmp", out);
}

}  // namespace kiln::ingest
