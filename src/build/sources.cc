// Source listing: ImageFolder, list files and CSV.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kiln/build/build.h"
#include "kiln/manifest.h"
#include "sources_tsv.h"

namespace kiln::build {

namespace fs = std::filesystem;

namespace {

bool HasImageExtension(const std::string& name) {
  static const char* kExt[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm",
                               ".tif", ".tiff", ".webp"};
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* e : kExt) {
    const size_t n = std::strlen(e);
    if (lower.size() > n && lower.compare(lower.size() - n, n, e) == 0) return true;
  }
  return false;
}

Status Stat(const std::string& root, SourceItem* item) {
  struct stat st;
  const std::string path = root + "/" + item->rel_path;
  if (::stat(path.c_str(), &st) != 0)
    return Status::NotFound(path + ": listed but not found");
  item->size = static_cast<uint64_t>(st.st_size);
  item->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return Status::OK();
}

Status AbsoluteRoot(const std::string& root, std::string* out) {
  std::error_code ec;
  fs::path p = fs::canonical(root, ec);
  if (ec) return Status::NotFound(root + ": source directory not found");
  if (!fs::is_directory(p)) return Status::InvalidArgument(root + ": not a directory");
  *out = p.string();
  return Status::OK();
}

// A relative path that stays inside the root: no absolute path, no "..".
bool InsideRoot(const std::string& rel) {
  if (rel.empty() || rel[0] == '/') return false;
  for (const auto& part : fs::path(rel))
    if (part == "..") return false;
  return true;
}

}  // namespace

Status ListImageFolder(const std::string& root, SourceList* out) {
  SourceList list;
  list.layout = "imagefolder";
  KILN_RETURN_IF_ERROR(AbsoluteRoot(root, &list.root));
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(list.root))
    if (e.is_directory()) classes.push_back(e.path().filename().string());
  std::sort(classes.begin(), classes.end());
  if (classes.empty())
    return Status::InvalidArgument(list.root +
                                   ": no class folders (expected SRC/<class>/<image files>)");
  for (size_t c = 0; c < classes.size(); ++c) {
    const fs::path dir = fs::path(list.root) / classes[c];
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink))
      if (e.is_regular_file() && HasImageExtension(e.path().filename().string()))
        files.push_back(fs::relative(e.path(), list.root).generic_string());
    if (files.empty())
      return Status::InvalidArgument(dir.string() +
                                     ": class folder holds no image files; remove it or add images");
    for (auto& f : files) {
      SourceItem item;
      item.rel_path = std::move(f);
      item.label = static_cast<int64_t>(c);
      KILN_RETURN_IF_ERROR(Stat(list.root, &item));
      list.items.push_back(std::move(item));
    }
  }
  list.classes = std::move(classes);
  std::sort(list.items.begin(), list.items.end(),
            [](const SourceItem& a, const SourceItem& b) { return a.rel_path < b.rel_path; });
  *out = std::move(list);
  return Status::OK();
}

Status ReadSourceList(const std::string& root, const std::string& list_path, SourceList* out) {
  SourceList list;
  KILN_RETURN_IF_ERROR(AbsoluteRoot(root, &list.root));
  std::ifstream in(list_path);
  if (!in) return Status::NotFound(list_path + ": list file not found");
  const bool csv = list_path.size() > 4 && list_path.compare(list_path.size() - 4, 4, ".csv") == 0;
  list.layout = csv ? "csv" : "list";
  std::string line;
  int lineno = 0;
  std::vector<std::pair<std::string, std::string>> rows;  // path, label text
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = list_path + ":" + std::to_string(lineno);
    std::string path, label;
    if (csv) {
      if (rows.empty() && lineno == 1) {
        if (line != "path,label")
          return Status::InvalidArgument(where + ": CSV header must be \"path,label\"");
        rows.reserve(1024);
        continue;
      }
      const size_t comma = line.rfind(',');
      if (comma == std::string::npos || comma == 0 || comma + 1 == line.size())
        return Status::InvalidArgument(where + ": expected \"path,label\", got \"" + line + "\"");
      path = line.substr(0, comma);
      label = line.substr(comma + 1);
    } else {
      const size_t sp = line.find_last_of(" \t");
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size())
        return Status::InvalidArgument(where + ": expected \"relative/path label\", got \"" + line +
                                       "\"");
      path = line.substr(0, line.find_last_not_of(" \t", sp) + 1);
      label = line.substr(sp + 1);
    }
    if (!InsideRoot(path))
      return Status::InvalidArgument(where + ": path \"" + path + "\" is outside " + list.root);
    rows.emplace_back(path, label);
  }
  // Labels: all integers -> used as given; otherwise class names, sorted.
  bool numeric = true;
  for (const auto& r : rows)
    numeric = numeric && !r.second.empty() &&
              std::all_of(r.second.begin(), r.second.end(), [](unsigned char ch) { return std::isdigit(ch); });
  std::map<std::string, int64_t> names;
  if (!numeric) {
    for (const auto& r : rows) names[r.second] = 0;
    int64_t i = 0;
    for (auto& kv : names) {
      kv.second = i++;
      list.classes.push_back(kv.first);
    }
  }
  int64_t max_label = -1;
  for (const auto& r : rows) {
    SourceItem item;
    item.rel_path = fs::path(r.first).lexically_normal().generic_string();
    item.label = numeric ? std::stoll(r.second) : names[r.second];
    max_label = std::max(max_label, item.label);
    KILN_RETURN_IF_ERROR(Stat(list.root, &item).WithContext(list_path));
    list.items.push_back(std::move(item));
  }
  if (numeric)
    for (int64_t i = 0; i <= max_label; ++i) list.classes.push_back(std::to_string(i));
  if (list.items.empty()) return Status::InvalidArgument(list_path + ": lists no files");
  std::sort(list.items.begin(), list.items.end(),
            [](const SourceItem& a, const SourceItem& b) { return a.rel_path < b.rel_path; });
  for (size_t i = 1; i < list.items.size(); ++i)
    if (list.items[i].rel_path == list.items[i - 1].rel_path)
      return Status::InvalidArgument(list_path + ": \"" + list.items[i].rel_path +
                                     "\" is listed twice");
  *out = std::move(list);
  return Status::OK();
}

std::string SourceDigest(const SourceList& list) {
  XXH3_state_t st;
  // A stack state must be initialized before reset (xxhash.h: XXH3_INITSTATE).
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset(&st);
  for (const SourceItem& it : list.items) {
    std::string line = it.rel_path + "\t" + std::to_string(it.label) + "\t" +
                       std::to_string(it.size) + "\t" + std::to_string(it.mtime_ns) + "\n";
    XXH3_64bits_update(&st, line.data(), line.size());
  }
  return DigestHex(XXH3_64bits_digest(&st));
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
    if (f.size() != 5) return Status::Corruption(path + ":" + std::to_string(lineno) + ": bad line");
    RecordedSource r;
    try {
      r.record = std::stoll(f[0]);
      r.item.rel_path = f[1];
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
    out += std::to_string(r.record) + "\t" + it.rel_path + "\t" + std::to_string(it.label) + "\t" +
           std::to_string(it.size) + "\t" + std::to_string(it.mtime_ns) + "\n";
  }
  std::ofstream f(path, std::ios::trunc);
  f << out;
  f.flush();
  return f ? Status::OK() : Status::IOError(path + ": cannot write");
}

}  // namespace kiln::build
