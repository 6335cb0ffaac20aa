// The build journal (internal): what makes a build resumable and its end
// certain. In the cache directory:
//   build.json       the recipe of the build in progress (removed at the end)
//   rejects.partial  "position<TAB>path<TAB>reason<TAB>retry" lines, appended
//                    as inputs are rejected, so a resumed build knows them
//   rejects.tsv      every reject of the finished build, in source order
// and the decision how a build starts: up to date, resumed, or fresh.
#ifndef KILN_SRC_INGEST_JOURNAL_H_
#define KILN_SRC_INGEST_JOURNAL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kiln/ingest/build.h"
#include "kiln/preprocessing.h"
#include "kiln/status.h"

namespace kiln::ingest {

// One rejected input, as rejects.tsv and rejects.partial hold it: path and
// reason escaped (core/escape.h), and whether the cause lay in the
// environment rather than in the input (Retryable): then the next build
// with the same arguments tries it again.
struct RejectEntry {
  std::string path, reason;
  bool retry = false;
  // "path: reason", for messages.
  std::string Text() const { return path + ": " + reason; }
  bool operator==(const RejectEntry& o) const {
    return path == o.path && reason == o.reason && retry == o.retry;
  }
};

// Whether an input rejected with `why` can be retried: an IOError, which
// says that the environment failed (permission denied, an I/O error, no
// descriptor or memory left; kiln::IsTransientError), not the file.
bool Retryable(const Status& why);

// rejects.tsv's text: the header "path<TAB>reason<TAB>retry" and a line
// "path<TAB>reason<TAB>yes|no" for each entry.
std::string RejectsTsv(const std::vector<RejectEntry>& entries);
// Reads a rejects.tsv (also one of an older kiln, without the retry
// column: its entries are not retried). NotFound when it does not exist,
// IOError naming it when it cannot be read.
Status ReadRejectsTsv(const std::string& path, std::vector<RejectEntry>* out);

enum class BuildStart { kUpToDate, kResume, kFresh };

// What a build does with what DIR already holds.
enum class Rebuild {
  kNo,         // keep an up-to-date cache, resume an unfinished build; refuse a changed one
  kIfChanged,  // the same, but rebuild a changed one (--rebuild-if-changed)
  kAlways,     // start from scratch whatever DIR holds (--force)
};

struct StartRequest {
  Preprocessing recipe;  // of the build to be done
  Rebuild rebuild = Rebuild::kNo;
  bool strict = false;  // --strict: a finished cache with rejects is not up to date
  // Processes a retryable reject of a finished cache again: true when it
  // now comes out otherwise (written, or rejected for a cause in the
  // file), so that a rebuild gives another cache. Null: never retried.
  std::function<bool(const RejectEntry&)> retry;
};

struct StartDecision {
  BuildStart start = BuildStart::kFresh;
  // kUpToDate: the cache's rejects that can be retried and were, but still
  // fail (the cache stays as it is; the next run tries them again).
  std::vector<RejectEntry> still_failing;
};

// Decides how a build of `request.recipe` into DIR starts, saying why
// through `info`:
//  - `rebuild` kAlways: kFresh.
//  - DIR holds a finished cache of the same recipe: its retryable rejects
//    are tried again (`request.retry`); kFresh as soon as one comes out
//    otherwise, else kUpToDate (with still_failing). Under `strict`, a
//    reject recorded in its rejects.tsv is then a Corruption naming it.
//  - a finished cache of another recipe: Stale saying what changed, unless
//    kIfChanged (then kFresh) - or unless the build that made it could not
//    read some sources for a cause outside them (source.unreadable, or a
//    retryable reject) and the recipes differ only in what reading the
//    sources again changes (source digest and counts, --norm auto's
//    statistics): then this is the retry, kFresh.
//  - no manifest but build.json of the same recipe: kResume; of another
//    recipe: Stale unless kIfChanged or a retry as above.
//  - nothing: kFresh.
Status DecideStart(const std::string& dir, const StartRequest& request, const InfoFn& info,
                   StartDecision* out);

// Discards what an earlier build left in DIR (shards, journal, sources.tsv,
// rejects.tsv) and records `recipe` in build.json, the manifest first, so
// that an interrupted discard never leaves DIR looking complete.
// REQUIRES: DIR's DirLock is held (a running build is never disturbed).
Status BeginFreshBuild(const std::string& dir, const Preprocessing& recipe);

// Removes build.json and rejects.partial once the manifest is written.
void EndBuild(const std::string& dir);

// Parses the text of rejects.partial (`where` names it): the positions of
// its "position<TAB>path<TAB>reason<TAB>retry" lines go to *positions, the
// rest to *entries (a line of an older kiln, without retry: not retried).
// A line without a tab (a write cut short) is skipped; a position that is
// not a decimal number is a Corruption naming the line.
Status ParseRejectLog(const std::string& text, const std::string& where,
                      std::set<size_t>* positions, std::vector<RejectEntry>* entries);

// The rejects of one build, logged to DIR/rejects.partial as they happen.
class RejectLog {
 public:
  RejectLog() = default;
  RejectLog(const RejectLog&) = delete;
  RejectLog& operator=(const RejectLog&) = delete;
  ~RejectLog();

  // Opens DIR/rejects.partial for appending; with `resume`, first reads
  // what the interrupted run logged (ParseRejectLog). IOError naming the
  // file, or ParseRejectLog's Corruption.
  Status Open(const std::string& dir, bool resume);
  void Close();

  // Source positions rejected by the interrupted run (resume only).
  const std::set<size_t>& before() const { return before_; }
  // Positions rejected by this run.
  const std::set<size_t>& now() const { return now_; }
  bool rejected(size_t position) const { return before_.count(position) || now_.count(position); }
  // Every reject so far, the interrupted run's first.
  const std::vector<RejectEntry>& entries() const { return entries_; }
  // How many of them can be retried.
  uint64_t retryable() const;

  // Logs that source position `position` (file `path`) was rejected, and
  // whether the next build should try it again. Path and reason are
  // escaped (core/escape.h): one line, four fields.
  Status Add(size_t position, const std::string& path, std::string reason, bool retry);
  // A source the listing could not use (SourceList::rejected): kept ahead
  // of the sources' rejects, in memory only (every run lists the sources
  // again), so rejects.tsv is the same after a resume.
  void AddListed(const std::string& path, const std::string& reason, bool retry);
  // Writes DIR/rejects.tsv (RejectsTsv of every entry), or DIR/`name`.
  Status WriteTsv() const;
  Status WriteTsvAs(const std::string& name) const;

 private:
  std::string dir_;
  int fd_ = -1;
  std::set<size_t> before_, now_;
  std::vector<RejectEntry> entries_;
  size_t listed_ = 0;  // entries_ begins with this many AddListed ones
};

// The first position of a plan of `sources` positions that is neither among
// the `written` records nor rejected before: where a resumed build goes on.
size_t ResumePoint(size_t sources, uint64_t written, const std::set<size_t>& rejected_before);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_JOURNAL_H_
