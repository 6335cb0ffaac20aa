#include "journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "core/decimal.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "core/escape.h"
#include "core/file.h"
#include "kiln/manifest.h"

namespace kiln::ingest {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRejectsHeader = "path\treason\tretry\n";

// The entry of a rejects.tsv line, or of a rejects.partial line after its
// position: "path<TAB>reason<TAB>retry", the retry field "yes" or "no"
// (absent in the files of an older kiln: no).
RejectEntry ParseRejectFields(std::string_view line) {
  RejectEntry e;
  const size_t t1 = line.find('\t');
  e.path = std::string(line.substr(0, t1));
  if (t1 == std::string_view::npos) return e;
  const std::string_view rest = line.substr(t1 + 1);
  const size_t t2 = rest.find('\t');
  e.reason = std::string(rest.substr(0, t2));
  e.retry = t2 != std::string_view::npos && rest.substr(t2 + 1) == "yes";
  return e;
}

std::string RejectRow(const RejectEntry& e) {
  return e.path + "\t" + e.reason + "\t" + (e.retry ? "yes" : "no") + "\n";
}

// A finished cache of the same recipe: its retryable rejects are tried
// again; up to date unless one comes out otherwise.
Status UpToDateOrRetry(const std::string& dir, const Manifest& old, const StartRequest& req,
                       const InfoFn& info, StartDecision* out) {
  std::vector<RejectEntry> rejects;
  const Status read = ReadRejectsTsv(dir + "/" + kRejectsName, &rejects);
  if (!read.ok() && !read.IsNotFound()) return read;
  std::vector<RejectEntry> retryable;
  for (const RejectEntry& e : rejects)
    if (e.retry) retryable.push_back(e);
  for (const RejectEntry& e : retryable) {
    if (req.retry && req.retry(e)) {
      info(dir + ": " + e.path + " was rejected for a cause outside the file (" + e.reason +
           ") and comes out otherwise now: rebuilding");
      out->start = BuildStart::kFresh;
      return Status::OK();
    }
  }
  out->start = BuildStart::kUpToDate;
  const std::string records = std::to_string(old.count) + " records";
  if (retryable.empty()) {
    info(dir + ": up to date (" + records + "; same sources and options) - nothing to do");
  } else {
    const size_t n = retryable.size();
    info(dir + ": " + records + ", same sources and options - nothing written; " +
         std::to_string(n) +
         (n == 1 ? " rejected input that can be retried still fails: "
                 : " rejected inputs that can be retried still fail, the first: ") +
         retryable.front().Text());
    out->still_failing = std::move(retryable);
  }
  if (req.strict && !rejects.empty())  // --strict holds for a cache built without it, too
    return Status::Corruption(rejects.front().Text() +
                              " (rejected when the cache was built; under --strict every "
                              "input must be written: fix or remove it, then rebuild with "
                              "--force)");
  return Status::OK();
}

// Whether the build that left `old` in DIR (its finished cache's recipe,
// or build.json's when `unfinished`) could not read some sources for a
// cause outside them - while listing or measuring --norm auto's statistics
// (old.source.unreadable), or while processing an image (a retryable
// reject in DIR) - and `now` differs from `old` only in what reading the
// sources again changes: the listing's digest and counts, and statistics
// measured from the images. Then this run is the retry the user was told
// to make, and it rebuilds without an option.
bool IsRetryOf(const std::string& dir, bool unfinished, const Preprocessing& old,
               const Preprocessing& now) {
  Preprocessing a = old, b = now;
  for (Preprocessing* p : {&a, &b}) {
    p->source.digest.clear();
    p->source.files = 0;
    p->source.unreadable = 0;
    if (p->norm == NormKind::kAuto) {
      p->mean.clear();
      p->std.clear();
    }
  }
  if (a != b) return false;
  if (old.source.unreadable > 0) return true;
  std::vector<RejectEntry> rejects;
  if (unfinished) {
    std::string text;
    std::set<size_t> positions;
    if (!ReadWholeFile(dir + "/" + kRejectLogName, &text).ok() ||
        !ParseRejectLog(text, kRejectLogName, &positions, &rejects).ok())
      return false;
  } else if (!ReadRejectsTsv(dir + "/" + kRejectsName, &rejects).ok()) {
    return false;
  }
  return std::any_of(rejects.begin(), rejects.end(), [](const RejectEntry& e) { return e.retry; });
}

}  // namespace

bool Retryable(const Status& why) { return why.IsIOError(); }

std::string RejectsTsv(const std::vector<RejectEntry>& entries) {
  std::string tsv = kRejectsHeader;
  for (const RejectEntry& e : entries) tsv += RejectRow(e);
  return tsv;
}

Status ReadRejectsTsv(const std::string& path, std::vector<RejectEntry>* out) {
  out->clear();
  std::string text;
  KILN_RETURN_IF_ERROR(ReadWholeFile(path, &text));
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line))
    if (!line.empty()) out->push_back(ParseRejectFields(line));
  return Status::OK();
}

Status DecideStart(const std::string& dir, const StartRequest& req, const InfoFn& info,
                   StartDecision* out) {
  *out = StartDecision();
  Manifest old;
  const bool finished = ReadManifest(dir, &old).ok();
  if (req.rebuild == Rebuild::kAlways) {
    std::error_code ec;
    if (finished || fs::exists(dir + "/" + kBuildStateName, ec))
      info(dir + ": rebuilding from scratch (--force)");
    return Status::OK();
  }
  if (finished) {
    if (old.preprocessing == req.recipe) return UpToDateOrRetry(dir, old, req, info, out);
    const std::string changes = RecipeChanges(old.preprocessing, req.recipe);
    if (IsRetryOf(dir, false, old.preprocessing, req.recipe)) {
      info(dir + ": the build that made it could not read some sources (see " + kRejectsName +
           "); reading them now changes " + changes + ": rebuilding");
      return Status::OK();
    }
    if (req.rebuild != Rebuild::kIfChanged)
      return Status::Stale(dir + ": holds a cache made from other sources or options (" + changes +
                           "); pass --force to rebuild it");
    info(dir + ": sources or options changed, rebuilding (--rebuild-if-changed): " + changes);
    return Status::OK();
  }
  std::string text;
  if (!ReadWholeFile(dir + "/" + kBuildStateName, &text).ok()) return Status::OK();
  Preprocessing prev;
  const bool readable = Preprocessing::FromJson(text, kBuildStateName, &prev).ok();
  if (readable && prev == req.recipe) {
    out->start = BuildStart::kResume;
  } else if (readable && IsRetryOf(dir, true, prev, req.recipe)) {
    info(dir + ": the unfinished build could not read some sources; reading them now changes " +
         RecipeChanges(prev, req.recipe) + ": starting over");
  } else if (req.rebuild == Rebuild::kIfChanged) {
    info(dir +
         ": discarding an unfinished build of other sources or options and starting over "
         "(--rebuild-if-changed)");
  } else {
    return Status::Stale(dir + ": holds an unfinished build with other sources or options (" +
                         (readable ? RecipeChanges(prev, req.recipe)
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
                      std::set<size_t>* positions, std::vector<RejectEntry>* entries) {
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
    entries->push_back(ParseRejectFields(std::string_view(line).substr(tab + 1)));
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
    KILN_RETURN_IF_ERROR(ParseRejectLog(text, path, &before_, &entries_));
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::IOError(path + ": cannot write");
  return Status::OK();
}

uint64_t RejectLog::retryable() const {
  return static_cast<uint64_t>(std::count_if(entries_.begin(), entries_.end(),
                                             [](const RejectEntry& e) { return e.retry; }));
}

Status RejectLog::Add(size_t position, const std::string& path, std::string reason, bool retry) {
  // Escaped (core/escape.h): a name or message with a tab or line break
  // stays one line of four fields.
  entries_.push_back({EscapeName(path), EscapeName(reason), retry});
  now_.insert(position);
  const std::string rec = std::to_string(position) + "\t" + RejectRow(entries_.back());
  if (::write(fd_, rec.data(), rec.size()) < 0)
    return Status::IOError(dir_ + "/" + kRejectLogName + ": write failed");
  return Status::OK();
}

void RejectLog::AddListed(const std::string& path, const std::string& reason, bool retry) {
  entries_.insert(entries_.begin() + static_cast<std::ptrdiff_t>(listed_++),
                  {EscapeName(path), EscapeName(reason), retry});
}

Status RejectLog::WriteTsv() const { return WriteTsvAs(kRejectsName); }

Status RejectLog::WriteTsvAs(const std::string& name) const {
  return WriteFileAtomic(dir_, name, name + ".tmp", RejectsTsv(entries_));
}

size_t ResumePoint(size_t sources, uint64_t written, const std::set<size_t>& rejected_before) {
  size_t start = 0;
  for (uint64_t good = 0; start < sources && good < written; ++start)
    if (!rejected_before.count(start)) ++good;
  while (start < sources && rejected_before.count(start)) ++start;
  return start;
}

}  // namespace kiln::ingest
