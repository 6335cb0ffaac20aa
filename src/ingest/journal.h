// The build journal (internal): what makes a build resumable and its end
// certain. In the cache directory:
//   build.json       the recipe of the build in progress (removed at the end)
//   rejects.partial  "position<TAB>path<TAB>reason" lines, appended as inputs
//                    are rejected, so a resumed build knows them
//   rejects.tsv      every reject of the finished build, in source order
// and the decision how a build starts: up to date, resumed, or fresh.
#ifndef KILN_SRC_INGEST_JOURNAL_H_
#define KILN_SRC_INGEST_JOURNAL_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kiln/ingest/build.h"
#include "kiln/preprocessing.h"
#include "kiln/status.h"

namespace kiln::ingest {

enum class BuildStart { kUpToDate, kResume, kFresh };

// What a build does with what DIR already holds.
enum class Rebuild {
  kNo,         // keep an up-to-date cache, resume an unfinished build; refuse a changed one
  kIfChanged,  // the same, but rebuild a changed one (--rebuild-if-changed)
  kAlways,     // start from scratch whatever DIR holds (--force)
};

// Decides how a build of `recipe` into DIR starts:
//  - `rebuild` kAlways: kFresh (said through `info` when DIR held a build).
//  - DIR holds a finished cache of the same recipe: kUpToDate (said through
//    `info`); under `strict`, a reject recorded in its rejects.tsv is a
//    Corruption naming it.
//  - a finished cache of another recipe: Stale saying what changed, unless
//    kIfChanged (then kFresh).
//  - no manifest but build.json of the same recipe: kResume; of another
//    recipe: Stale unless kIfChanged.
//  - nothing: kFresh.
Status DecideStart(const std::string& dir, const Preprocessing& recipe, Rebuild rebuild,
                   bool strict, const InfoFn& info, BuildStart* out);

// Discards what an earlier build left in DIR (shards, journal, sources.tsv,
// rejects.tsv) and records `recipe` in build.json, the manifest first, so
// that an interrupted discard never leaves DIR looking complete.
// REQUIRES: DIR's DirLock is held (a running build is never disturbed).
Status BeginFreshBuild(const std::string& dir, const Preprocessing& recipe);

// Removes build.json and rejects.partial once the manifest is written.
void EndBuild(const std::string& dir);

// A rejects.tsv / rejects.partial line ("path<TAB>reason") as "path: reason".
std::string RejectText(std::string line);

// Parses the text of rejects.partial (`where` names it): the positions of
// its "position<TAB>path<TAB>reason" lines go to *positions, their
// "path<TAB>reason" parts to *lines. A line without a tab (a write cut
// short) is skipped; a position that is not a decimal number is a
// Corruption naming the line.
Status ParseRejectLog(const std::string& text, const std::string& where,
                      std::set<size_t>* positions, std::vector<std::string>* lines);

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
  // Every reject so far as "path<TAB>reason", the interrupted run's first.
  const std::vector<std::string>& lines() const { return lines_; }

  // Logs that source position `position` (file `path`) was rejected.
  // Path and reason are escaped (kiln/escape.h): one line, two fields.
  Status Add(size_t position, const std::string& path, std::string reason);
  // A line of the list file that names no usable file (SourceList::rejected):
  // kept ahead of the sources' rejects, in memory only (every run lists the
  // sources again), so rejects.tsv is the same after a resume.
  void AddListed(const std::string& path, const std::string& reason);
  // Writes DIR/rejects.tsv: a header and every line.
  Status WriteTsv() const;

 private:
  std::string dir_;
  int fd_ = -1;
  std::set<size_t> before_, now_;
  std::vector<std::string> lines_;
  size_t listed_ = 0;  // lines_ begins with this many AddListed lines
};

// The first position of a plan of `sources` positions that is neither among
// the `written` records nor rejected before: where a resumed build goes on.
size_t ResumePoint(size_t sources, uint64_t written, const std::set<size_t>& rejected_before);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_JOURNAL_H_
