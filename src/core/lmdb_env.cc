#include "core/lmdb_env.h"

#include "core/fault_guard.h"
#include "core/file.h"
#include "kiln/record.h"

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
                     const std::function<bool(const MDB_val& key, const MDB_val& value)>& fn,
                     uint64_t* values) {
  return ForEachRecordIn(
      env, txn, [&](const MDB_val& k, const MDB_val& v, const MDB_val&, bool) { return fn(k, v); },
      values);
}

Status ForEachRecordIn(
    const LmdbEnv& env, const LmdbTxn& txn,
    const std::function<bool(const MDB_val& key, const MDB_val& value, const MDB_val& stored,
                             bool first_of_stored)>& fn,
    uint64_t* values) {
  MDB_cursor* cur = nullptr;
  KILN_RETURN_IF_ERROR(LmdbStatus(mdb_cursor_open(txn.get(), env.dbi(), &cur), env.path()));
  MDB_val k, v;
  int rc;
  uint64_t walked = 0;
  bool go = true;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == MDB_SUCCESS && go;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    ++walked;
    const uint8_t* value = static_cast<const uint8_t*>(v.mv_data);
    bool whole = !IsPack(value, v.mv_size) || k.mv_size != kKeySize;
    if (!whole) {
      // A pack: its records one by one, if its table holds (checked
      // before the first is given, so that a damaged one is given whole).
      const uint64_t first = DecodeKey(static_cast<const uint8_t*>(k.mv_data));
      const uint32_t n = PackCount(value);
      const uint8_t* rec;
      size_t len;
      for (uint32_t j = 0; j < n && !whole; ++j)
        whole = !PackEntry(value, v.mv_size, first, j, &rec, &len).ok() ||
                first + j < first;  // keys past 2^64 - 1
      for (uint32_t j = 0; j < n && !whole && go; ++j) {
        (void)PackEntry(value, v.mv_size, first, j, &rec, &len);
        uint8_t key[kKeySize];
        EncodeKey(first + j, key);
        const MDB_val sub_k{kKeySize, key}, sub_v{len, const_cast<uint8_t*>(rec)};
        go = fn(sub_k, sub_v, v, j == 0);
      }
    }
    if (whole) go = fn(k, v, v, true);
    if (!go) break;
  }
  mdb_cursor_close(cur);
  if (values) *values = walked;
  return rc == MDB_SUCCESS || rc == MDB_NOTFOUND ? Status::OK() : LmdbStatus(rc, env.path());
}

PackCursor::~PackCursor() {
  if (cursor_) mdb_cursor_close(cursor_);
}

Status FindRecord(const LmdbEnv& env, MDB_txn* txn, uint64_t key, bool packed,
                  PackCursor* cursor, MDB_val* value) {
  uint8_t kb[kKeySize];
  EncodeKey(key, kb);
  MDB_val k{kKeySize, kb}, v;
  int rc = mdb_get(txn, env.dbi(), &k, &v);
  uint64_t first = key;
  if (rc == MDB_NOTFOUND && packed) {
    // The pack before the key: the last LMDB key below it.
    if (cursor->cursor_ == nullptr) {
      rc = mdb_cursor_open(txn, env.dbi(), &cursor->cursor_);
    } else if (cursor->stale_) {
      rc = mdb_cursor_renew(txn, cursor->cursor_);
    } else {
      rc = MDB_SUCCESS;
    }
    cursor->stale_ = false;
    if (rc != MDB_SUCCESS) return LmdbStatus(rc, env.path() + ": a cursor");
    MDB_val at = k;
    rc = mdb_cursor_get(cursor->cursor_, &at, &v, MDB_SET_RANGE);
    rc = mdb_cursor_get(cursor->cursor_, &at, &v, rc == MDB_NOTFOUND ? MDB_LAST : MDB_PREV);
    if (rc == MDB_SUCCESS) {
      if (at.mv_size != kKeySize) return Status::NotFound("no record under key");
      first = DecodeKey(static_cast<const uint8_t*>(at.mv_data));
      if (first > key || !IsPack(static_cast<const uint8_t*>(v.mv_data), v.mv_size) ||
          key - first >= PackCount(static_cast<const uint8_t*>(v.mv_data)))
        return Status::NotFound("no record under key " + std::to_string(key));
    }
  }
  if (rc == MDB_NOTFOUND) return Status::NotFound("no record under key " + std::to_string(key));
  if (rc != MDB_SUCCESS) return LmdbStatus(rc, env.path() + ": key " + std::to_string(key));
  // Without packs the value is not read (Locate serves read-ahead, which
  // must not fault the value in).
  const uint8_t* stored = static_cast<const uint8_t*>(v.mv_data);
  if (!packed || !IsPack(stored, v.mv_size)) {
    *value = v;
    return Status::OK();
  }
  const uint8_t* rec = nullptr;
  size_t len = 0;
  KILN_RETURN_IF_ERROR(PackEntry(stored, v.mv_size, first, static_cast<uint32_t>(key - first),
                                 &rec, &len)
                           .WithContext(env.path()));
  *value = MDB_val{len, const_cast<uint8_t*>(rec)};
  return Status::OK();
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
