// Source listing: ImageFolder, list files and CSV.
#include <dirent.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/ingest/build.h"

#include "core/decimal.h"
#include "journal.h"
#include "core/escape.h"
#include "core/file.h"
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
            {list.root + "/" + r.path,
             r.where + ": label " + r.label + ": numeric labels are class indices 0.." +
                 std::to_string(kMaxClasses - 1) + " (or give every line a class name)",
             false});
        continue;
      }
    } else {
      item.label = names[r.label];
    }
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
