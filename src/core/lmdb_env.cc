#include "core/lmdb_env.h"

#include "core/fault_guard.h"
#include "core/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

namespace kiln {

Status LmdbStatus(int rc, const std::string& context) {
  if (rc == MDB_SUCCESS) return Status::OK();
  const std::string msg = context + ": " + mdb_strerror(rc) + NoSpaceAdvice(rc);
  switch (rc) {
    case MDB_NOTFOUND:
    case ENOENT:
      return Status::NotFound(msg);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_BAD_TXN:
    case MDB_BAD_VALSIZE:
      return Status::Corruption(msg);
    default:
      return Status::IOError(msg);
  }
}

Status LmdbEnv::OpenDbi(bool write) {
  LmdbTxn txn;
  KILN_RETURN_IF_ERROR(txn.Begin(*this, !write));
  int rc = mdb_dbi_open(txn.get(), nullptr, 0, &dbi_);
  KILN_RETURN_IF_ERROR(LmdbStatus(rc, path_));
  if (!write) FindMap(txn);
  return write ? txn.Commit() : Status::OK();  // a read txn's dbi stays open after abort
}

void LmdbEnv::FindMap(const LmdbTxn& txn) {
  // LMDB does not say where it mapped the file (mdb_env_info's address is
  // the one a MDB_FIXEDMAP file asked for). The first key lies in a leaf
  // page whose header starts with its page number: the map begins that
  // many pages before the page. Page-sized pages only, as every kiln
  // shard has (LMDB uses the OS page size).
  MDB_stat st;
  if (mdb_env_stat(env_, &st) != MDB_SUCCESS || st.ms_psize != static_cast<unsigned>(sysconf(_SC_PAGESIZE)))
    return;
  MDB_cursor* cursor = nullptr;
  if (mdb_cursor_open(txn.get(), dbi_, &cursor) != MDB_SUCCESS) return;
  MDB_val k, v;
  if (mdb_cursor_get(cursor, &k, &v, MDB_FIRST) == MDB_SUCCESS) {
    const uintptr_t page = reinterpret_cast<uintptr_t>(k.mv_data) / st.ms_psize * st.ms_psize;
    uint64_t pgno = 0;
    std::memcpy(&pgno, reinterpret_cast<const void*>(page), sizeof pgno);
    if (pgno * st.ms_psize <= page) map_ = reinterpret_cast<const uint8_t*>(page - pgno * st.ms_psize);
  }
  mdb_cursor_close(cursor);
}

namespace {
// A shard cut short (a copy that stopped, a full disk) must fail with a
// message, not with SIGBUS when a page past the end of the file is read.
Status CheckNotTruncated(MDB_env* env, const std::string& path) {
  MDB_envinfo info;
  MDB_stat st;
  struct stat file;
  if (mdb_env_info(env, &info) != MDB_SUCCESS || mdb_env_stat(env, &st) != MDB_SUCCESS ||
      ::stat(path.c_str(), &file) != 0)
    return Status::OK();  // nothing to compare; LMDB reports its own errors
  const uint64_t need = (static_cast<uint64_t>(info.me_last_pgno) + 1) * st.ms_psize;
  if (static_cast<uint64_t>(file.st_size) < need)
    return Status::Corruption(path + ": truncated: " + std::to_string(file.st_size) +
                              " bytes, its pages need " + std::to_string(need));
  return Status::OK();
}
}  // namespace

Status LmdbEnv::OpenForWrite(const std::string& path, uint64_t map_size) {
  Close();
  path_ = path;
  int rc = mdb_env_create(&env_);
  // map_size 0 keeps the size recorded in an existing file.
  if (rc == MDB_SUCCESS && map_size > 0) rc = mdb_env_set_mapsize(env_, map_size);
  if (rc == MDB_SUCCESS) rc = mdb_env_open(env_, path.c_str(), MDB_NOSUBDIR | MDB_NOSYNC | MDB_NOMETASYNC, 0644);
  if (rc != MDB_SUCCESS) {
    Close();
    return LmdbStatus(rc, path);
  }
  if (Status t = CheckNotTruncated(env_, path); !t.ok()) {
    Close();
    return t;
  }
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  return OpenDbi(/*write=*/true);
}

Status OpenSharedForRead(const std::string& path, unsigned max_readers,
                         std::shared_ptr<const LmdbEnv>* out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return LmdbStatus(errno, path);
  using Key = std::tuple<pid_t, dev_t, ino_t>;
  static std::mutex mu;
  static std::map<Key, std::weak_ptr<const LmdbEnv>> open;
  const Key key{::getpid(), st.st_dev, st.st_ino};
  std::lock_guard<std::mutex> lock(mu);
  auto it = open.find(key);
  if (it != open.end()) {
    if (std::shared_ptr<const LmdbEnv> env = it->second.lock()) {
      *out = std::move(env);
      return Status::OK();
    }
  }
  auto env = std::make_unique<LmdbEnv>();
  KILN_RETURN_IF_ERROR(env->OpenForRead(path, max_readers));
  // Closed under the lock, so that no new environment on the file is
  // opened while this one's close clears the process's reader slots.
  std::shared_ptr<const LmdbEnv> shared(env.release(), [key](const LmdbEnv* e) {
    std::lock_guard<std::mutex> l(mu);
    delete e;
    auto i = open.find(key);
    if (i != open.end() && i->second.expired()) open.erase(i);
  });
  open[key] = shared;
  *out = std::move(shared);
  return Status::OK();
}

Status LmdbEnv::OpenForRead(const std::string& path, unsigned max_readers) {
  Close();
  path_ = path;
  const unsigned base = MDB_NOSUBDIR | MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD;
  for (unsigned extra : {0u, static_cast<unsigned>(MDB_NOLOCK)}) {
    int rc = mdb_env_create(&env_);
    if (rc == MDB_SUCCESS) rc = mdb_env_set_maxreaders(env_, max_readers);
    if (rc == MDB_SUCCESS) rc = mdb_env_open(env_, path.c_str(), base | extra, 0644);
    if (rc == MDB_SUCCESS) {
      if (Status t = CheckNotTruncated(env_, path); !t.ok()) {
        Close();
        return t;
      }
      MDB_envinfo info;
      mdb_env_info(env_, &info);
      map_size_ = info.me_mapsize;
      // A reader's page that changes under it fails an LMDB assertion;
      // inside a GuardedRead that becomes an error (core/fault_guard.h).
      RouteLmdbAssertions(env_);
      return OpenDbi(/*write=*/false);
    }
    Close();
    // The lock file cannot be made on a read-only filesystem: nothing can be
    // writing there, so reading without the lock is safe.
    if (!(extra == 0 && (rc == EACCES || rc == EROFS))) return LmdbStatus(rc, path);
  }
  return Status::IOError(path + ": cannot open");
}

int LmdbEnv::fd() const {
  mdb_filehandle_t fd = -1;
  if (env_ == nullptr || mdb_env_get_fd(env_, &fd) != MDB_SUCCESS) return -1;
  return fd;
}

void LmdbEnv::Close() {
  if (env_ != nullptr) mdb_env_close(env_);
  env_ = nullptr;
  map_ = nullptr;
  dbi_ = 0;
}

Status LmdbEnv::SetMapSize(uint64_t bytes) {
  int rc = mdb_env_set_mapsize(env_, bytes);
  if (rc == MDB_SUCCESS) map_size_ = bytes;
  return LmdbStatus(rc, path_ + ": growing the map");
}

Status ForEachRecord(const LmdbEnv& env, const LmdbTxn& txn,
                     const std::function<bool(const MDB_val& key, const MDB_val& value)>& fn) {
  MDB_cursor* cur = nullptr;
  KILN_RETURN_IF_ERROR(LmdbStatus(mdb_cursor_open(txn.get(), env.dbi(), &cur), env.path()));
  MDB_val k, v;
  int rc;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == MDB_SUCCESS;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    if (!fn(k, v)) break;
  mdb_cursor_close(cur);
  return rc == MDB_SUCCESS || rc == MDB_NOTFOUND ? Status::OK() : LmdbStatus(rc, env.path());
}

Status LmdbTxn::Begin(const LmdbEnv& env, bool read_only) {
  Abort();
  ctx_ = &env.path();
  const int rc = mdb_txn_begin(env.env(), nullptr, read_only ? MDB_RDONLY : 0, &txn_);
  return rc == MDB_SUCCESS ? Status::OK() : LmdbStatus(rc, *ctx_);
}

int LmdbTxn::CommitRc() {
  int rc = mdb_txn_commit(txn_);
  txn_ = nullptr;
  return rc;
}

Status LmdbTxn::Commit() {
  const std::string ctx = ctx_ ? *ctx_ : std::string("lmdb");
  return LmdbStatus(CommitRc(), ctx + ": commit");
}

void LmdbTxn::Abort() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
  txn_ = nullptr;
}

void LmdbTxn::Reset() {
  if (txn_ != nullptr) mdb_txn_reset(txn_);
}

Status LmdbTxn::Renew() {
  const int rc = mdb_txn_renew(txn_);
  return rc == MDB_SUCCESS ? Status::OK() : LmdbStatus(rc, ctx_ ? *ctx_ : std::string("lmdb"));
}

}  // namespace kiln
