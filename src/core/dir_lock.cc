#include "kiln/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "kiln/cache_layout.h"
#include "core/file.h"

namespace kiln {

Status DirLock::Acquire(const std::string& dir, std::unique_ptr<DirLock>* out) {
  KILN_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string path = dir + "/" + kLockName;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError(path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return Status::IOError(dir + ": in use by another kiln build (" + path +
                           " is locked); wait for it to finish");
  }
  out->reset(new DirLock(dir, fd));
  return Status::OK();
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln
