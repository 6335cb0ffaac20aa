// DirLock: the one writer of a cache directory. An exclusive flock(2) on
// DIR/.kiln.lock, held for the lock's lifetime; a second writer (another
// process, or another lock in this one) is refused at once, never waits.
//
// CacheWriter::Open and RewriteRecords take it themselves; a caller that
// must change DIR before the writer opens (kiln build --force discarding an
// old cache) takes it first and hands it to the writer.
#ifndef KILN_DIR_LOCK_H_
#define KILN_DIR_LOCK_H_

#include <memory>
#include <string>

#include "kiln/status.h"

namespace kiln {

class DirLock {
 public:
  // Creates DIR (and its parents) if absent and locks it. Returns IOError
  // ("in use by another kiln build") when another writer holds it.
  static Status Acquire(const std::string& dir, std::unique_ptr<DirLock>* out);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  DirLock(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_ = -1;
};

}  // namespace kiln

#endif  // KILN_DIR_LOCK_H_
