// Source listing: ImageFolder, list files and CSV.
#include <dirent.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/decimal.h"
#include "core/escape.h"
#include "core/file.h"
#include "journal.h"
#include "kiln/ingest/build.h"
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

// Fills in a listed file's size and mtime. IOError when the environment
// keeps it from being read (IsTransientError), NotFound otherwise.
Status Stat(const std::string& root, SourceItem* item) {
  struct stat st;
  const std::string path = root + "/" + item->rel_path;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (IsTransientError(err)) return Status::IOError(std::strerror(err));
    return Status::NotFound(path + ": listed but not found");
  }
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

// A folder's identity: a folder met again below itself is a symbolic link loop.
struct FolderId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FolderId& o) const { return dev == o.dev && ino == o.ino; }
};

FolderId IdOf(const struct stat& st) { return {st.st_dev, st.st_ino}; }

std::string ErrorText(int err) { return std::strerror(err); }

// Lists an ImageFolder tree (ListImageFolder), one folder at a time, never
// stopping for one bad part of it.
class FolderWalker {
 public:
  FolderWalker(const std::string& root, const FolderId* skip, SourceList* list)
      : root_(root), skip_(skip), list_(list) {}

  struct Entry {
    std::string name;
    struct stat st;  // through links
  };

  // The entries of the folder ROOT/rel, sorted by name. An entry that
  // cannot be stat'ed is rejected here (or dropped, when it is gone since
  // the folder was read). False, with the folder rejected, when the folder
  // cannot be read.
  bool ReadFolder(const std::string& rel, std::vector<Entry>* entries) {
    entries->clear();
    const std::string dir = PathOf(rel);
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      const int err = errno;
      Reject(dir, "cannot list the folder: " + ErrorText(err), IsTransientError(err));
      return false;
    }
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const struct dirent* e = ::readdir(d);
      if (e == nullptr) break;
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) {
      Reject(dir, "cannot list the folder completely: " + ErrorText(err), IsTransientError(err));
      return false;
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      Entry entry{name, {}};
      const std::string path = dir + "/" + name;
      if (::stat(path.c_str(), &entry.st) == 0) {
        entries->push_back(std::move(entry));
        continue;
      }
      const int why = errno;
      struct stat link;
      if (why == ELOOP) {
        Reject(path, "a symbolic link loop (" + ErrorText(why) + "); not followed", false);
      } else if (why == ENOENT) {
        // A link that leads nowhere is worth a line when it names an image;
        // an entry removed since the folder was read is simply gone.
        if (::lstat(path.c_str(), &link) == 0 && HasImageExtension(name))
          Reject(path, "a symbolic link to a file that does not exist", false);
      } else {
        Reject(path, "cannot read: " + ErrorText(why), IsTransientError(why));
      }
    }
    return true;
  }

  // Lists the image files below the folder ROOT/rel with `label`; `chain`
  // holds the folders from the root down to it, to tell a link loop.
  void Walk(const std::string& rel, int64_t label,
            std::vector<std::pair<FolderId, std::string>>* chain) {
    std::vector<Entry> entries;
    if (!ReadFolder(rel, &entries)) return;
    for (const Entry& e : entries) {
      const std::string child = rel + "/" + e.name;
      if (S_ISDIR(e.st.st_mode)) {
        const FolderId id = IdOf(e.st);
        if (skip_ != nullptr && id == *skip_) continue;
        const auto loop = std::find_if(chain->begin(), chain->end(),
                                       [&](const auto& c) { return c.first == id; });
        if (loop != chain->end()) {
          Reject(
              PathOf(child),
              "a symbolic link loop: it leads back to " +
                  (loop->second.empty() ? std::string("the source root") : PathOf(loop->second)) +
                  "; not followed",
              false);
          continue;
        }
        chain->push_back({id, child});
        Walk(child, label, chain);
        chain->pop_back();
      } else if (S_ISREG(e.st.st_mode) && HasImageExtension(e.name)) {
        SourceItem item;
        item.rel_path = child;
        item.label = label;
        item.size = static_cast<uint64_t>(e.st.st_size);
        item.mtime_ns =
            static_cast<int64_t>(e.st.st_mtim.tv_sec) * 1000000000 + e.st.st_mtim.tv_nsec;
        list_->items.push_back(std::move(item));
      }
    }
  }

  void Reject(const std::string& path, const std::string& reason, bool retry) {
    list_->rejected.push_back({path, reason, retry});
  }

  std::string PathOf(const std::string& rel) const {
    return rel.empty() ? root_ : root_ + "/" + rel;
  }

 private:
  const std::string root_;
  const FolderId* skip_;
  SourceList* list_;
};

}  // namespace

Status ListImageFolder(const std::string& root, SourceList* out, const std::string& skip) {
  SourceList list;
  list.layout = "imagefolder";
  KILN_RETURN_IF_ERROR(AbsoluteRoot(root, &list.root));
  struct stat st;
  if (::stat(list.root.c_str(), &st) != 0) return PosixError(list.root, errno);
  const FolderId root_id = IdOf(st);
  FolderId skip_id;
  const bool skipping = !skip.empty() && ::stat(skip.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (skipping) skip_id = IdOf(st);
  FolderWalker walker(list.root, skipping ? &skip_id : nullptr, &list);
  std::vector<FolderWalker::Entry> top;
  if (!walker.ReadFolder("", &top))
    return Status::IOError(list.rejected.back().path + ": " + list.rejected.back().reason +
                           "; make the source folder readable and run the command again");
  // Class folders: the root's folders (through links), sorted by name.
  std::vector<std::string> classes;
  std::vector<FolderId> class_ids;
  for (const FolderWalker::Entry& e : top) {
    if (!S_ISDIR(e.st.st_mode) || (skipping && IdOf(e.st) == skip_id)) continue;
    if (IdOf(e.st) == root_id) {
      walker.Reject(walker.PathOf(e.name),
                    "a symbolic link loop: it leads back to the source root; not a class", false);
      continue;
    }
    classes.push_back(e.name);
    class_ids.push_back(IdOf(e.st));
  }
  if (classes.empty())
    return Status::InvalidArgument(list.root +
                                   ": no class folders (expected SRC/<class>/<image files>)");
  for (size_t c = 0; c < classes.size(); ++c) {
    const size_t items = list.items.size(), rejects = list.rejected.size();
    std::vector<std::pair<FolderId, std::string>> chain = {{root_id, ""},
                                                           {class_ids[c], classes[c]}};
    walker.Walk(classes[c], static_cast<int64_t>(c), &chain);
    // A class folder with nothing in it is a mistake; one whose images
    // could not be listed has its rejects to say why.
    if (list.items.size() == items && list.rejected.size() == rejects)
      return Status::InvalidArgument(
          walker.PathOf(classes[c]) +
          ": class folder holds no image files; remove it or add images");
  }
  list.classes = std::move(classes);
  std::sort(list.items.begin(), list.items.end(),
            [](const SourceItem& a, const SourceItem& b) { return a.rel_path < b.rel_path; });
  std::sort(list.rejected.begin(), list.rejected.end(),
            [](const SourceReject& a, const SourceReject& b) { return a.path < b.path; });
  *out = std::move(list);
  return Status::OK();
}

uint64_t SourceList::retryable() const {
  return static_cast<uint64_t>(std::count_if(rejected.begin(), rejected.end(),
                                             [](const SourceReject& r) { return r.retry; }));
}

Status ListSources(const std::string& root, const std::string& list_file, SourceList* out,
                   const std::string& skip) {
  return list_file.empty() ? ListImageFolder(root, out, skip)
                           : ReadSourceList(root, list_file, out);
}

Status ReadSourceList(const std::string& root, const std::string& list_path, SourceList* out) {
  std::string abs_root;
  KILN_RETURN_IF_ERROR(AbsoluteRoot(root, &abs_root));
  std::ifstream in(list_path);
  if (!in) return Status::NotFound(list_path + ": list file not found");
  return ParseSourceList(
      in, list_path, abs_root, [&abs_root](SourceItem* item) { return Stat(abs_root, item); }, out);
}

Status ParseSourceList(std::istream& in, const std::string& list_path, const std::string& root,
                       const std::function<Status(SourceItem*)>& stat, SourceList* out) {
  SourceList list;
  list.root = root;
  const bool csv = list_path.size() > 4 && list_path.compare(list_path.size() - 4, 4, ".csv") == 0;
  list.layout = csv ? "csv" : "list";
  std::string line;
  int lineno = 0;
  struct Row {
    std::string path, label, where;
    std::vector<float> targets;
  };
  size_t n_targets = 0;  // float columns after the label column
  std::vector<Row> rows;
  bool header = !csv;  // a CSV's first line that is not a comment is its header
  while (std::getline(in, line)) {
    ++lineno;
    if (lineno == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // a UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = list_path + ":" + std::to_string(lineno);
    std::string path, label;
    std::vector<float> row_targets;
    if (csv) {
      if (!header) {
        // path,label | path,labels, then any float target columns.
        std::vector<std::string> cols;
        for (size_t at = 0;;) {
          const size_t next = line.find(',', at);
          cols.push_back(
              line.substr(at, next == std::string::npos ? std::string::npos : next - at));
          if (next == std::string::npos) break;
          at = next + 1;
        }
        bool ok =
            cols.size() >= 2 && cols[0] == "path" && (cols[1] == "label" || cols[1] == "labels");
        for (size_t c = 2; ok && c < cols.size(); ++c) ok = !cols[c].empty();
        if (!ok)
          return Status::InvalidArgument(
              where +
              ": CSV header must be \"path,label\" or \"path,labels\" (several labels "
              "separated by ';'), optionally followed by float target columns");
        list.multi_label = cols[1] == "labels";
        list.target_names.assign(cols.begin() + 2, cols.end());
        n_targets = list.target_names.size();
        header = true;
        continue;
      }
      // From the right: the float columns, then the label column; the rest
      // is the path (which may hold commas, quoted).
      std::string rest = line;
      std::vector<float> targets(n_targets);
      bool ok = true;
      for (size_t t = n_targets; ok && t-- > 0;) {
        const size_t comma = rest.rfind(',');
        if (comma == std::string::npos) {
          ok = false;
          break;
        }
        const std::string cell = rest.substr(comma + 1);
        char* end = nullptr;
        const double v = cell.empty() ? 0 : std::strtod(cell.c_str(), &end);
        ok = !cell.empty() && end == cell.c_str() + cell.size() && std::isfinite(v) &&
             std::fabs(v) <= 3.4e38;
        targets[t] = static_cast<float>(v);
        rest.erase(comma);
      }
      const size_t comma = rest.rfind(',');
      const bool empty_labels_ok = list.multi_label && comma != std::string::npos;
      if (!ok || comma == std::string::npos || comma == 0 ||
          (comma + 1 == rest.size() && !empty_labels_ok)) {
        list.rejected.push_back(
            {line, where + ": expected \"path," +
                       std::string(list.multi_label ? "labels" : "label") +
                       (n_targets ? ",<" + std::to_string(n_targets) + " numbers>" : "") + "\""});
        continue;
      }
      path = rest.substr(0, comma);
      label = rest.substr(comma + 1);
      row_targets = std::move(targets);
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
    rows.push_back({path, label, where, std::move(row_targets)});
  }
  // Labels: all integers -> class indices, used as given (0 or more, so that
  // "-1" is an error, not a class name); otherwise class names, sorted.
  auto integer = [](const std::string& t) {
    const size_t digits = t[0] == '-' ? 1 : 0;
    return t.size() > digits && std::all_of(t.begin() + digits, t.end(),
                                            [](unsigned char ch) { return std::isdigit(ch); });
  };
  // A multi-label field's labels, split at ';' (none for an empty field).
  auto tokens = [&](const std::string& field) {
    std::vector<std::string> out;
    if (!list.multi_label) return std::vector<std::string>{field};
    for (size_t at = 0; at < field.size();) {
      size_t next = field.find(';', at);
      if (next == std::string::npos) next = field.size();
      if (next > at) out.push_back(field.substr(at, next - at));
      at = next + 1;
    }
    return out;
  };
  bool numeric = true;
  for (const auto& r : rows)
    for (const std::string& t : tokens(r.label)) numeric = numeric && integer(t);
  std::map<std::string, int64_t> names;
  if (!numeric) {
    for (const auto& r : rows)
      for (const std::string& t : tokens(r.label)) names[t] = 0;
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
    item.targets = r.targets;
    bool bad = false;
    for (const std::string& t : tokens(r.label)) {
      int64_t v = 0;
      if (numeric) {
        if (!ParseDecimal(t, &v) || v < 0 || v >= kMaxClasses) {
          list.rejected.push_back(
              {list.root + "/" + r.path,
               r.where + ": label " + t + ": numeric labels are class indices 0.." +
                   std::to_string(kMaxClasses - 1) + " (or give every line a class name)",
               false});
          bad = true;
          break;
        }
      } else {
        v = names[t];
      }
      if (list.multi_label) {
        item.labels.push_back(v);
      } else {
        item.label = v;
      }
    }
    if (bad) continue;
    std::sort(item.labels.begin(), item.labels.end());
    item.labels.erase(std::unique(item.labels.begin(), item.labels.end()), item.labels.end());
    const Status found = stat(&item);
    if (!found.ok()) {
      // A file the environment keeps from being read is listed again by
      // the next build (Retryable); a missing one stays missing.
      const bool retry = Retryable(found);
      list.rejected.push_back({list.root + "/" + item.rel_path,
                               r.where + (retry ? ": listed but cannot be read: " + found.message()
                                                : std::string(": listed but not found")),
                               retry});
      continue;
    }
    max_label = std::max(max_label, item.label);
    for (int64_t v : item.labels) max_label = std::max(max_label, v);
    list.items.push_back(std::move(item));
  }
  if (numeric)
    for (int64_t i = 0; i <= max_label; ++i) list.classes.push_back(std::to_string(i));
  if (list.items.empty())
    return Status::InvalidArgument(list_path + ": lists no usable files" +
                                   (list.rejected.empty()
                                        ? std::string()
                                        : " (the first line: " + list.rejected[0].reason + ")"));
  std::sort(list.items.begin(), list.items.end(),
            [](const SourceItem& a, const SourceItem& b) { return a.rel_path < b.rel_path; });
  for (size_t i = 1; i < list.items.size(); ++i)
    if (list.items[i].rel_path == list.items[i - 1].rel_path)
      return Status::InvalidArgument(list_path + ": \"" + list.items[i].rel_path +
                                     "\" is listed twice");
  *out = std::move(list);
  return Status::OK();
}

const SourceItem* FindSource(const SourceList& list, const std::string& rel_path) {
  const auto it = std::lower_bound(
      list.items.begin(), list.items.end(), rel_path,
      [](const SourceItem& item, const std::string& r) { return item.rel_path < r; });
  return it == list.items.end() || it->rel_path != rel_path ? nullptr : &*it;
}

std::string MaskRelPath(const std::string& rel_path) {
  return fs::path(rel_path).replace_extension(".png").string();
}

std::string MasksDigest(const SourceList& list, const std::string& masks_dir) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset(&st);
  for (const SourceItem& it : list.items) {
    const std::string rel = MaskRelPath(it.rel_path);
    struct stat s;
    std::string line = EscapeName(rel) + "\t";
    if (::stat((masks_dir + "/" + rel).c_str(), &s) == 0)
      line +=
          std::to_string(s.st_size) + "\t" +
          std::to_string(static_cast<int64_t>(s.st_mtim.tv_sec) * 1000000000 + s.st_mtim.tv_nsec);
    else
      line += "-";
    line += "\n";
    XXH3_64bits_update(&st, line.data(), line.size());
  }
  return DigestHex(XXH3_64bits_digest(&st));
}

std::string SourceDigest(const SourceList& list) {
  XXH3_state_t st;
  // A stack state must be initialized before reset (xxhash.h: XXH3_INITSTATE).
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset(&st);
  for (const SourceItem& it : list.items) {
    // Escaped as sources.tsv writes it: a name with a tab stays one field.
    std::string line = EscapeName(it.rel_path) + "\t" + std::to_string(it.label) + "\t" +
                       std::to_string(it.size) + "\t" + std::to_string(it.mtime_ns);
    // A CSV's several labels and float targets (absent otherwise, so that
    // other listings keep their digests).
    if (list.multi_label || !list.target_names.empty()) {
      line += "\t";
      for (size_t k = 0; k < it.labels.size(); ++k)
        line += (k ? ";" : "") + std::to_string(it.labels[k]);
      for (float t : it.targets) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "\t%.9g", t);
        line += buf;
      }
    }
    line += "\n";
    XXH3_64bits_update(&st, line.data(), line.size());
  }
  return DigestHex(XXH3_64bits_digest(&st));
}

}  // namespace kiln::ingest
