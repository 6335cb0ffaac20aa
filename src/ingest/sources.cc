// Source listing: ImageFolder, list files and CSV.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/ingest/build.h"

#include "core/decimal.h"
#include "kiln/escape.h"
#include "kiln/manifest.h"
#include "source_list.h"
#include "sources_tsv.h"

namespace kiln::ingest {

namespace fs = std::filesystem;

namespace {

bool HasImageExtension(const std::string& name) {
  static const char* kExt[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                               ".pgm", ".tif",  ".tiff", ".webp"};
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
  if (::stat(path.c_str(), &st) != 0) return Status::NotFound(path + ": listed but not found");
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

namespace {
Status ListImageFolderOrThrow(const std::string& root, SourceList* out);
}  // namespace

Status ListImageFolder(const std::string& root, SourceList* out) {
  try {
    return ListImageFolderOrThrow(root, out);
  } catch (const fs::filesystem_error& e) {
    return Status::InvalidArgument(root + ": cannot list the source tree (" + e.what() +
                                   "); a symbolic link loop or an unreadable folder?");
  }
}

namespace {
Status ListImageFolderOrThrow(const std::string& root, SourceList* out) {
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
    // Paths as listed, below the root: a symbolic link keeps its own name
    // (and its class), not its target's.
    for (const auto& e :
         fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink))
      if (e.is_regular_file() && HasImageExtension(e.path().filename().string()))
        files.push_back(e.path().lexically_relative(list.root).generic_string());
    if (files.empty())
      return Status::InvalidArgument(
          dir.string() + ": class folder holds no image files; remove it or add images");
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
}  // namespace

Status ListSources(const std::string& root, const std::string& list_file, SourceList* out) {
  return list_file.empty() ? ListImageFolder(root, out) : ReadSourceList(root, list_file, out);
}

Status ReadSourceList(const std::string& root, const std::string& list_path, SourceList* out) {
  std::string abs_root;
  KILN_RETURN_IF_ERROR(AbsoluteRoot(root, &abs_root));
  std::ifstream in(list_path);
  if (!in) return Status::NotFound(list_path + ": list file not found");
  return ParseSourceList(
      in, list_path, abs_root, [&abs_root](SourceItem* item) { return Stat(abs_root, item).ok(); },
      out);
}

Status ParseSourceList(std::istream& in, const std::string& list_path, const std::string& root,
                       const std::function<bool(SourceItem*)>& stat, SourceList* out) {
  SourceList list;
  list.root = root;
  const bool csv = list_path.size() > 4 && list_path.compare(list_path.size() - 4, 4, ".csv") == 0;
  list.layout = csv ? "csv" : "list";
  std::string line;
  int lineno = 0;
  struct Row {
    std::string path, label, where;
  };
  std::vector<Row> rows;
  bool header = !csv;  // a CSV's first line that is not a comment is its header
  while (std::getline(in, line)) {
    ++lineno;
    if (lineno == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // a UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = list_path + ":" + std::to_string(lineno);
    std::string path, label;
    if (csv) {
      if (!header) {
        if (line != "path,label")
          return Status::InvalidArgument(where + ": CSV header must be \"path,label\"");
        header = true;
        continue;
      }
      const size_t comma = line.rfind(',');
      if (comma == std::string::npos || comma == 0 || comma + 1 == line.size()) {
        list.rejected.push_back({line, where + ": expected \"path,label\""});
        continue;
      }
      path = line.substr(0, comma);
      label = line.substr(comma + 1);
      // A quoted field, as Python's csv module writes one with a comma or a
      // quote in it: "a,b.png" and "say ""hi"".png".
      if (path.size() >= 2 && path.front() == '"' && path.back() == '"') {
        std::string unq;
        for (size_t i = 1; i + 1 < path.size(); ++i) {
          unq += path[i];
          if (path[i] == '"' && path[i + 1] == '"') ++i;
        }
        path = unq;
      }
    } else {
      const size_t sp = line.find_last_of(" \t");
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size()) {
        list.rejected.push_back({line, where + ": expected \"relative/path label\""});
        continue;
      }
      path = line.substr(0, line.find_last_not_of(" \t", sp) + 1);
      label = line.substr(sp + 1);
    }
    if (!InsideRoot(path)) {
      list.rejected.push_back({path, where + ": the path is outside the source root " + list.root});
      continue;
    }
    rows.push_back({path, label, where});
  }
  // Labels: all integers -> class indices, used as given (0 or more, so that
  // "-1" is an error, not a class name); otherwise class names, sorted.
  auto integer = [](const std::string& t) {
    const size_t digits = t[0] == '-' ? 1 : 0;
    return t.size() > digits && std::all_of(t.begin() + digits, t.end(),
                                            [](unsigned char ch) { return std::isdigit(ch); });
  };
  bool numeric = true;
  for (const auto& r : rows) numeric = numeric && integer(r.label);
  std::map<std::string, int64_t> names;
  if (!numeric) {
    for (const auto& r : rows) names[r.label] = 0;
    int64_t i = 0;
    for (auto& kv : names) {
      kv.second = i++;
      list.classes.push_back(kv.first);
    }
  }
  // Numeric labels name classes 0..max: a class count beyond this is a typo.
  constexpr int64_t kMaxClasses = 1 << 20;
  int64_t max_label = -1;
  for (const auto& r : rows) {
    SourceItem item;
    item.rel_path = fs::path(r.path).lexically_normal().generic_string();
    if (numeric) {
      if (!ParseDecimal(r.label, &item.label) || item.label < 0 || item.label >= kMaxClasses) {
        list.rejected.push_back(
            {list.root + "/" + r.path, r.where + ": label " + r.label +
                                           ": numeric labels are class indices 0.." +
                                           std::to_string(kMaxClasses - 1) +
                                           " (or give every line a class name)"});
        continue;
      }
    } else {
      item.label = names[r.label];
    }
    if (!stat(&item)) {
      list.rejected.push_back({list.root + "/" + item.rel_path, r.where + ": listed but not found"});
      continue;
    }
    max_label = std::max(max_label, item.label);
    list.items.push_back(std::move(item));
  }
  if (numeric)
    for (int64_t i = 0; i <= max_label; ++i) list.classes.push_back(std::to_string(i));
  if (list.items.empty())
    return Status::InvalidArgument(
        list_path + ": lists no usable files" +
        (list.rejected.empty() ? std::string()
                               : " (the first line: " + list.rejected[0].second + ")"));
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
    // Escaped as sources.tsv writes it: a name with a tab stays one field.
    std::string line = EscapeName(it.rel_path) + "\t" + std::to_string(it.label) + "\t" +
                       std::to_string(it.size) + "\t" + std::to_string(it.mtime_ns) + "\n";
    XXH3_64bits_update(&st, line.data(), line.size());
  }
  return DigestHex(XXH3_64bits_digest(&st));
}

}  // namespace kiln::ingest
