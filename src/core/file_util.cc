#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

namespace kiln {

std::string NoSpaceAdvice(int err) {
  if (err != ENOSPC && err != EDQUOT && err != EFBIG) return "";
  return "; no space left for the cache: free space on its filesystem (or raise the quota or "
         "file size limit, or give another OUT) and run the same command again - what was "
         "committed is kept and the build resumes";
}

Status PosixError(const std::string& context, int err) {
  if (err == ENOENT) return Status::NotFound(context + ": " + std::strerror(err));
  return Status::IOError(context + ": " + std::strerror(err) + NoSpaceAdvice(err));
}

Status ReadWholeFile(const std::string& path, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError(path, errno);
  out->clear();
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return PosixError(path, err);
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return Status::OK();
}

bool IsTransientError(int err) {
  static const int kTransient[] = {EACCES,   EPERM,       EIO,          EMFILE,    ENFILE,
                                   ENOMEM,   EAGAIN,      EBUSY,        EINTR,     ETIMEDOUT,
                                   ESTALE,   ENOBUFS,     ENOLCK,       ENXIO,     ENODEV,
                                   ENOTCONN, ECONNRESET,  ECONNABORTED, EHOSTDOWN, EHOSTUNREACH,
                                   ENETDOWN, ENETUNREACH, EREMOTEIO,    ENOMEDIUM};
  return std::find(std::begin(kTransient), std::end(kTransient), err) != std::end(kTransient);
}

namespace {
// ReadFileBytes' Status for errno `err`: "<what>: <reason>".
Status ReadError(const char* what, int err) {
  const std::string msg = std::string(what) + ": " + std::strerror(err);
  if (IsTransientError(err)) return Status::IOError(msg);
  if (err == ENOENT) return Status::NotFound(msg);
  return Status::InvalidArgument(msg);
}
}  // namespace

Status ReadFileBytes(const std::string& path, std::vector<uint8_t>* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ReadError("cannot open", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ReadError("cannot stat", err);
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t off = 0;
  while (off < out->size()) {
    ssize_t n = ::read(fd, out->data() + off, out->size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ReadError("cannot read", err);
    }
    if (n == 0) {
      ::close(fd);
      return Status::InvalidArgument("the file shrank while it was read (it changed)");
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::OK();
}

Status WriteFileAtomic(const std::string& dir, const std::string& name, const std::string& temp,
                       const std::string& content) {
  const std::string tmp_path = dir + "/" + temp;
  const std::string final_path = dir + "/" + name;
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError(tmp_path, errno);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return PosixError(tmp_path, err);
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return PosixError(tmp_path, err);
  }
  ::close(fd);
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) return PosixError(final_path, errno);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::OK();
}

Status SyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError(path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? Status::OK() : PosixError(path + ": fsync", err);
}

Status FileSize(const std::string& path, uint64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PosixError(path, errno);
  *size = static_cast<uint64_t>(st.st_size);
  return Status::OK();
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return Status::OK();
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return PosixError(cur, errno);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::IOError(path + ": exists and is not a directory");
  return Status::OK();
}

}  // namespace kiln
