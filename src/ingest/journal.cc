#include "journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "core/decimal.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "kiln/escape.h"
#include "kiln/file.h"
#include "kiln/manifest.h"

namespace kiln::ingest {

namespace fs = std::filesystem;

std::string RejectText(std::string line) {
  const size_t tab = line.find('\t');
  if (tab != std::string::npos) line.replace(tab, 1, ": ");
  return line;
}

Status DecideStart(const std::string& dir, const Preprocessing& recipe, Rebuild rebuild,
                   bool strict, const InfoFn& info, BuildStart* out) {
  *out = BuildStart::kFresh;
  Manifest old;
  const bool finished = ReadManifest(dir, &old).ok();
  if (rebuild == Rebuild::kAlways) {
    std::error_code ec;
    if (finished || fs::exists(dir + "/" + kBuildStateName, ec))
      info(dir + ": rebuilding from scratch (--force)");
    return Status::OK();
  }
  if (finished) {
    if (old.preprocessing == recipe) {
      *out = BuildStart::kUpToDate;
      info(dir + ": up to date (" + std::to_string(old.count) +
           " records; same sources and options) - nothing to do");
      if (strict) {  // --strict holds for a cache built without it, too
        std::ifstream rj(dir + "/" + kRejectsName);
        std::string line;
        if (std::getline(rj, line) && std::getline(rj, line) && !line.empty())
          return Status::Corruption(RejectText(line) +
                                    " (rejected when the cache was built; under --strict every "
                                    "input must be written: fix or remove it, then rebuild with "
                                    "--force)");
      }
      return Status::OK();
    }
    const std::string changes = RecipeChanges(old.preprocessing, recipe);
    if (rebuild != Rebuild::kIfChanged)
      return Status::Stale(dir + ": holds a cache made from other sources or options (" + changes +
                           "); pass --force to rebuild it");
    info(dir + ": sources or options changed, rebuilding (--rebuild-if-changed): " + changes);
    return Status::OK();
  }
  std::string text;
  if (!ReadWholeFile(dir + "/" + kBuildStateName, &text).ok()) return Status::OK();
  Preprocessing prev;
  const bool readable = Preprocessing::FromJson(text, kBuildStateName, &prev).ok();
  if (readable && prev == recipe) {
    *out = BuildStart::kResume;
  } else if (rebuild == Rebuild::kIfChanged) {
    info(dir +
         ": discarding an unfinished build of other sources or options and starting over "
         "(--rebuild-if-changed)");
  } else {
    return Status::Stale(dir + ": holds an unfinished build with other sources or options (" +
                         (readable ? RecipeChanges(prev, recipe)
                                   : std::string("the recorded options are unreadable")) +
                         "); pass --force to start over");
  }
  return Status::OK();
}

Status BeginFreshBuild(const std::string& dir, const Preprocessing& recipe) {
  KILN_RETURN_IF_ERROR(RemoveManifest(dir));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (IsShardFile(n) || n == kRejectLogName || n == kRejectsName || n == kBuildStateName ||
        n == kSourcesTsvName || n == kDuplicatesTsvName)
      fs::remove(e.path(), ec);
  }
  if (ec) return Status::IOError(dir + ": cannot clear (" + ec.message() + ")");
  // Indented, for a person who looks at an unfinished build.
  const std::string pretty = nlohmann::json::parse(recipe.ToJson()).dump(2) + "\n";
  return WriteFileAtomic(dir, kBuildStateName, std::string(kBuildStateName) + ".tmp", pretty);
}

void EndBuild(const std::string& dir) {
  std::error_code ec;
  fs::remove(dir + "/" + kBuildStateName, ec);
  fs::remove(dir + "/" + kRejectLogName, ec);
}

RejectLog::~RejectLog() { Close(); }

void RejectLog::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status ParseRejectLog(const std::string& text, const std::string& where,
                      std::set<size_t>* positions, std::vector<std::string>* lines) {
  std::istringstream in(text);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    size_t position = 0;
    if (!ParseDecimal(std::string_view(line).substr(0, tab), &position))
      return Status::Corruption(where + ":" + std::to_string(lineno) +
                                ": not a source position; pass --force to start the build over");
    positions->insert(position);
    lines->push_back(line.substr(tab + 1));
  }
  return Status::OK();
}

Status RejectLog::Open(const std::string& dir, bool resume) {
  dir_ = dir;
  const std::string path = dir + "/" + kRejectLogName;
  if (resume) {
    std::string text;
    const Status s = ReadWholeFile(path, &text);
    if (!s.IsNotFound()) KILN_RETURN_IF_ERROR(s);
    KILN_RETURN_IF_ERROR(ParseRejectLog(text, path, &before_, &lines_));
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::IOError(path + ": cannot write");
  return Status::OK();
}

Status RejectLog::Add(size_t position, const std::string& path, std::string reason) {
  // Escaped (kiln/escape.h): a name or message with a tab or line break
  // stays one line of two fields.
  const std::string line = EscapeName(path) + "\t" + EscapeName(reason);
  lines_.push_back(line);
  now_.insert(position);
  const std::string rec = std::to_string(position) + "\t" + line + "\n";
  if (::write(fd_, rec.data(), rec.size()) < 0)
    return Status::IOError(dir_ + "/" + kRejectLogName + ": write failed");
  return Status::OK();
}

void RejectLog::AddListed(const std::string& path, const std::string& reason) {
  lines_.insert(lines_.begin() + static_cast<std::ptrdiff_t>(listed_++),
                EscapeName(path) + "\t" + EscapeName(reason));
}

Status RejectLog::WriteTsv() const {
  std::string tsv = "path\treason\n";
  for (const auto& l : lines_) tsv += l + "\n";
  return WriteFileAtomic(dir_, kRejectsName, std::string(kRejectsName) + ".tmp", tsv);
}

size_t ResumePoint(size_t sources, uint64_t written, const std::set<size_t>& rejected_before) {
  size_t start = 0;
  for (uint64_t good = 0; start < sources && good < written; ++start)
    if (!rejected_before.count(start)) ++good;
  while (start < sources && rejected_before.count(start)) ++start;
  return start;
}

}  // namespace kiln::ingest
