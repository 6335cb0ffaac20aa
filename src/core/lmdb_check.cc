#include "core/lmdb_check.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace kiln {
namespace {

// LMDB 0.9's on-disk layout (mdb.c), 64-bit little-endian.
constexpr uint64_t kPageHeader = 16;  // PAGEHDRSZ: pgno, pad, flags, lower/upper or pages
constexpr uint64_t kNodeHeader = 8;   // NODESIZE: lo, hi, flags, ksize
constexpr uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04, kMeta = 0x08, kLeaf2 = 0x20,
                   kSubPage = 0x40;
constexpr uint16_t kPageTypes = kBranch | kLeaf | kOverflow | kMeta | kLeaf2 | kSubPage;
constexpr uint16_t kBigData = 0x01;  // F_BIGDATA: the value is on overflow pages
constexpr uint32_t kMagic = 0xBEEFC0DE, kDataVersion = 1;
constexpr uint64_t kInvalidPage = ~uint64_t{0};  // P_INVALID: an empty tree's root
constexpr uint32_t kMaxDepth = 32;               // CURSOR_STACK
// Leaf pages read at once when they follow each other in the file.
constexpr uint64_t kReadAhead = 32;
// MDB_meta, from the page's start: magic, version, address, mapsize, the
// free and main databases (MDB_db: pad = page size for the free one, flags,
// depth, branch, leaf and overflow page counts, entries, root), last page,
// transaction id.
constexpr uint64_t kMetaMagic = kPageHeader, kMetaVersion = kPageHeader + 4,
                   kMetaPageSize = kPageHeader + 24, kMainDb = kPageHeader + 72,
                   kMetaLastPage = kPageHeader + 120, kMetaTxnid = kPageHeader + 128,
                   kMetaEnd = kPageHeader + 136;
// Offsets inside an MDB_db.
constexpr uint64_t kDbFlags = 4, kDbDepth = 6, kDbBranch = 8, kDbLeaf = 16, kDbOverflow = 24,
                   kDbEntries = 32, kDbRoot = 40;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct Meta {
  uint64_t page_size, last_page, txnid;
  uint16_t flags, depth;
  uint64_t branch, leaf, overflow, entries, root;
};

// Where a page number was found, for messages (made only on failure).
struct From {
  uint64_t page = kInvalidPage;  // kInvalidPage: the meta page's root
  uint64_t node = 0;
  bool value = false;  // an overflow value's first page, not a child page
  std::string ToString() const {
    if (page == kInvalidPage) return "the root";
    return "page " + std::to_string(page) + " node " + std::to_string(node) +
           (value ? "'s value" : "");
  }
};

class Walker {
 public:
  Walker(const std::string& path, int fd, uint64_t file_bytes)
      : path_(path), fd_(fd), file_bytes_(file_bytes) {}

  Status Run(LmdbFileSummary* out) {
    Meta meta;
    KILN_RETURN_IF_ERROR(ReadMeta(&meta));
    out->page_size = psize_;
    out->depth = meta.depth;
    if (meta.root == kInvalidPage) return Status::OK();
    depth_ = meta.depth;
    seen_.assign((pages_ + 63) / 64, 0);
    // One page buffer per branch level, reused by every page there, and
    // the leaf pages' read-ahead.
    buffers_.assign(depth_, std::vector<uint8_t>(psize_));
    ahead_.resize(kReadAhead * psize_);
    KILN_RETURN_IF_ERROR(Visit(meta.root, 1, From()));
    if (entries_ != meta.entries)
      return Damaged("the tree holds " + std::to_string(entries_) +
                     " entries, its meta page says " + std::to_string(meta.entries));
    if (branch_ != meta.branch || leaf_ != meta.leaf || overflow_ != meta.overflow)
      return Damaged("the tree has " + Counts(branch_, leaf_, overflow_) + ", its meta page says " +
                     Counts(meta.branch, meta.leaf, meta.overflow));
    out->entries = entries_;
    out->tree_pages = branch_ + leaf_;
    return Status::OK();
  }

 private:
  // The meta page LMDB's readers use, checked with the tree's root and
  // depth: two small reads.
  Status ReadMeta(Meta* out) {
    // Both meta pages must be sound (LMDB refuses the file otherwise).
    Meta m[2];
    std::vector<uint8_t> page(kMetaEnd);
    uint64_t offset = 0;
    for (int i = 0; i < 2; ++i) {
      KILN_RETURN_IF_ERROR(
          ReadAt(offset, kMetaEnd, page.data(), [i] { return "meta page " + std::to_string(i); }));
      KILN_RETURN_IF_ERROR(ParseMeta(i, page.data(), &m[i]));
      offset += m[0].page_size;
    }
    if (m[0].page_size != m[1].page_size)
      return Damaged("the meta pages disagree on the page size (" + std::to_string(m[0].page_size) +
                     " and " + std::to_string(m[1].page_size) + ")");
    // Without a lock file LMDB reads through the meta page with the larger
    // transaction id; with one, through page (that id & 1), as it wrote it.
    // They must be the same page.
    const int picked = m[1].txnid > m[0].txnid ? 1 : 0;
    if (static_cast<int>(m[picked].txnid & 1) != picked)
      return Damaged("meta page " + std::to_string(picked) + " holds the newest transaction id " +
                     std::to_string(m[picked].txnid) + ", which LMDB writes to meta page " +
                     std::to_string(m[picked].txnid & 1));
    const Meta& meta = m[picked];
    psize_ = meta.page_size;
    if (meta.last_page < 1 || meta.last_page >= file_bytes_ / psize_)
      return Damaged("the meta page's last page " + std::to_string(meta.last_page) +
                     " is not inside the file's " + std::to_string(file_bytes_ / psize_) +
                     " pages");
    pages_ = meta.last_page + 1;
    // kiln's shards are one unnamed database without flags; the dup-sort
    // flags would make LMDB read sub-pages kiln never writes.
    if (meta.flags != 0)
      return Damaged("the main database has flags 0x" + Hex(meta.flags) + " (kiln writes none)");
    if (meta.root == kInvalidPage) {
      if (meta.depth != 0 || meta.entries != 0)
        return Damaged("an empty tree of depth " + std::to_string(meta.depth) + " with " +
                       std::to_string(meta.entries) + " entries");
    } else if (meta.depth < 1 || meta.depth > kMaxDepth) {
      return Damaged("a tree depth of " + std::to_string(meta.depth));
    } else if (meta.root < 2 || meta.root >= pages_) {
      return Damaged("the root is page " + std::to_string(meta.root) + ", outside pages 2.." +
                     std::to_string(pages_ - 1));
    }
    *out = meta;
    return Status::OK();
  }

  Status Damaged(const std::string& what) const {
    return Status::Corruption(path_ + ": LMDB structure damaged: " + what);
  }
  Status DamagedPage(uint64_t pgno, const std::string& what) const {
    return Damaged("page " + std::to_string(pgno) + ": " + what);
  }
  static std::string Hex(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
    return buf;
  }
  static std::string Counts(uint64_t b, uint64_t l, uint64_t o) {
    return std::to_string(b) + " branch, " + std::to_string(l) + " leaf and " + std::to_string(o) +
           " overflow pages";
  }
  static std::string Node(uint64_t i) { return "node " + std::to_string(i); }

  // Reads `n` bytes at `offset`; `what()` names them in an error.
  template <typename What>
  Status ReadAt(uint64_t offset, uint64_t n, uint8_t* dst, What what) const {
    if (offset > file_bytes_ || n > file_bytes_ - offset)
      return Damaged(what() + " lies past the end of the " + std::to_string(file_bytes_) +
                     "-byte file");
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Status::IOError(path_ + ": cannot read: " + std::strerror(errno));
      if (got == 0) return Damaged(what() + ": the file ends early (changed while read?)");
      done += static_cast<uint64_t>(got);
    }
    return Status::OK();
  }
  Status ReadPage(uint64_t pgno, uint64_t n, uint8_t* dst) const {
    return ReadAt(pgno * psize_, n, dst, [pgno] { return "page " + std::to_string(pgno); });
  }

  Status ParseMeta(int i, const uint8_t* p, Meta* m) const {
    const std::string name = "meta page " + std::to_string(i);
    if (!(Load<uint16_t>(p + 10) & kMeta)) return Damaged(name + " is not marked as a meta page");
    if (Load<uint32_t>(p + kMetaMagic) != kMagic)
      return Damaged(name + " lacks LMDB's magic number");
    if (Load<uint32_t>(p + kMetaVersion) != kDataVersion)
      return Damaged(name + " has data version " +
                     std::to_string(Load<uint32_t>(p + kMetaVersion)) + " (LMDB 0.9 writes 1)");
    m->page_size = Load<uint32_t>(p + kMetaPageSize);
    if (m->page_size < 512 || m->page_size > 65536 || (m->page_size & (m->page_size - 1)))
      return Damaged(name + " has a page size of " + std::to_string(m->page_size));
    const uint8_t* db = p + kMainDb;
    m->flags = Load<uint16_t>(db + kDbFlags);
    m->depth = Load<uint16_t>(db + kDbDepth);
    m->branch = Load<uint64_t>(db + kDbBranch);
    m->leaf = Load<uint64_t>(db + kDbLeaf);
    m->overflow = Load<uint64_t>(db + kDbOverflow);
    m->entries = Load<uint64_t>(db + kDbEntries);
    m->root = Load<uint64_t>(db + kDbRoot);
    m->last_page = Load<uint64_t>(p + kMetaLastPage);
    m->txnid = Load<uint64_t>(p + kMetaTxnid);
    return Status::OK();
  }

  // Marks `pgno` (with `count` pages from it) as reached, refusing pages
  // outside the tree's range and pages reached twice.
  Status Claim(uint64_t pgno, uint64_t count, const From& from) {
    if (pgno < 2 || pgno >= pages_ || count > pages_ - pgno)
      return Damaged(from.ToString() + " points to page " + std::to_string(pgno) +
                     (count > 1 ? " (" + std::to_string(count) + " pages)" : "") +
                     ", outside pages 2.." + std::to_string(pages_ - 1));
    // A word of the bitmap at a time: an overflow value of a 3x224x224
    // float16 record spans 74 pages.
    for (uint64_t i = pgno; i < pgno + count;) {
      const uint64_t bit = i % 64, n = std::min<uint64_t>(64 - bit, pgno + count - i);
      const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << bit;
      if (const uint64_t twice = seen_[i / 64] & mask)
        return Damaged(from.ToString() + " points to page " +
                       std::to_string(i - bit + __builtin_ctzll(twice)) + ", reached before");
      seen_[i / 64] |= mask;
      i += n;
    }
    return Status::OK();
  }

  // Reads tree page `pgno` at `level` into *page, valid until the next
  // page of that level is read. Small records fill a leaf page in two
  // (Fashion-MNIST: 30,000 leaf pages), and kiln's shards, written in key
  // order, hold them one after another: after two leaves in a row, the
  // next kReadAhead pages come in one read instead of a system call each.
  // Leaves far apart (between large records' overflow pages) are read
  // alone.
  Status ReadTreePage(uint64_t pgno, uint32_t level, const uint8_t** page) {
    if (level < depth_) {
      *page = buffers_[level].data();
      return ReadPage(pgno, psize_, buffers_[level].data());
    }
    if (pgno < ahead_first_ || pgno >= ahead_first_ + ahead_pages_) {
      const uint64_t n = pgno == last_leaf_ + 1 ? std::min(kReadAhead, pages_ - pgno) : 1;
      ahead_first_ = pgno;
      ahead_pages_ = 0;
      KILN_RETURN_IF_ERROR(ReadPage(pgno, n * psize_, ahead_.data()));
      ahead_pages_ = n;
    }
    last_leaf_ = pgno;
    *page = ahead_.data() + (pgno - ahead_first_) * psize_;
    return Status::OK();
  }

  Status Visit(uint64_t pgno, uint32_t level, const From& from) {
    KILN_RETURN_IF_ERROR(Claim(pgno, 1, from));
    const uint8_t* p;
    KILN_RETURN_IF_ERROR(ReadTreePage(pgno, level, &p));
    if (Load<uint64_t>(p) != pgno)
      return DamagedPage(pgno, "its header says page " + std::to_string(Load<uint64_t>(p)));
    const uint16_t type = Load<uint16_t>(p + 10) & kPageTypes;
    const bool leaf = level == depth_;
    if (type != (leaf ? kLeaf : kBranch))
      return DamagedPage(pgno, "type 0x" + Hex(type) + " at depth " + std::to_string(level) +
                                   " of " + std::to_string(depth_) + ", not a " +
                                   (leaf ? "leaf" : "branch") + " page");
    const uint64_t lower = Load<uint16_t>(p + 12), upper = Load<uint16_t>(p + 14);
    if (lower < kPageHeader || lower > upper || upper > psize_ || (lower - kPageHeader) % 2)
      return DamagedPage(
          pgno, "free space bounds " + std::to_string(lower) + ".." + std::to_string(upper));
    const uint64_t keys = (lower - kPageHeader) / 2;
    // LMDB asserts that a branch page of the main database has two keys.
    if (keys < (leaf ? 1u : 2u))
      return DamagedPage(
          pgno, std::to_string(keys) + " keys on a " + (leaf ? "leaf" : "branch") + " page");
    (leaf ? leaf_ : branch_) += 1;
    for (uint64_t i = 0; i < keys; ++i) {
      const uint64_t at = Load<uint16_t>(p + kPageHeader + 2 * i);
      if (at < upper || at % 2 || at + kNodeHeader > psize_)
        return DamagedPage(pgno, Node(i) + " at offset " + std::to_string(at) + ", outside " +
                                     std::to_string(upper) + ".." + std::to_string(psize_));
      const uint8_t* n = p + at;
      const uint64_t lo = Load<uint16_t>(n), hi = Load<uint16_t>(n + 2);
      const uint16_t flags = Load<uint16_t>(n + 4);
      const uint64_t ksize = Load<uint16_t>(n + 6);
      const uint64_t key_end = at + kNodeHeader + ksize;
      if (key_end > psize_)
        return DamagedPage(
            pgno, Node(i) + ": a key of " + std::to_string(ksize) + " bytes runs past the page");
      if (!leaf) {  // a branch node's size fields and flags hold the child's page number
        const uint64_t child = lo | hi << 16 | uint64_t{flags} << 32;
        KILN_RETURN_IF_ERROR(Visit(child, level + 1, From{pgno, i, false}));
        continue;
      }
      ++entries_;
      const uint64_t dsize = lo | hi << 16;
      if (flags == 0) {
        if (key_end + dsize > psize_)
          return DamagedPage(pgno, Node(i) + ": a value of " + std::to_string(dsize) +
                                       " bytes runs past the page");
        continue;
      }
      if (flags != kBigData)
        return DamagedPage(pgno, Node(i) + " has flags 0x" + Hex(flags) +
                                     " (kiln writes plain and overflow values only)");
      if (key_end + 8 > psize_)
        return DamagedPage(pgno, Node(i) + ": its overflow page number runs past the page");
      const uint64_t first = Load<uint64_t>(n + kNodeHeader + ksize);
      const uint64_t count = (kPageHeader - 1 + dsize) / psize_ + 1;  // OVPAGES
      const From value{pgno, i, true};
      KILN_RETURN_IF_ERROR(Claim(first, count, value));
      overflow_ += count;
      // LMDB reads the value at (first page + 16 bytes, dsize bytes) without
      // looking at that page's header: the claim above is all it needs
      // (kiln verify checks the header where it reads the value).
    }
    return Status::OK();
  }

  const std::string& path_;
  int fd_;
  uint64_t file_bytes_;
  uint64_t psize_ = 0, pages_ = 0;
  uint32_t depth_ = 0;
  uint64_t entries_ = 0, branch_ = 0, leaf_ = 0, overflow_ = 0;
  std::vector<uint64_t> seen_;                 // a bit per page reached
  std::vector<std::vector<uint8_t>> buffers_;  // one page per branch level (from 1)
  std::vector<uint8_t> ahead_;                 // leaf pages ahead_first_.. (ahead_pages_)
  uint64_t ahead_first_ = 0, ahead_pages_ = 0, last_leaf_ = kInvalidPage - 1;
};

}  // namespace

Status CheckLmdbFile(const std::string& path, uint64_t file_bytes, LmdbFileSummary* out) {
  *out = LmdbFileSummary();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  Walker walker(path, fd, file_bytes);
  Status s = walker.Run(out);
  close(fd);
  return s;
}

std::string OverflowHeaderProblem(const uint8_t* header, uint64_t pgno, uint64_t value_bytes,
                                  uint64_t page_size) {
  const uint64_t count = (kPageHeader - 1 + value_bytes) / page_size + 1;  // OVPAGES
  if (Load<uint64_t>(header) == pgno && (Load<uint16_t>(header + 10) & kPageTypes) == kOverflow &&
      Load<uint32_t>(header + 12) >= count)
    return "";
  return "not the overflow page of " + std::to_string(count) + " pages that a value of " +
         std::to_string(value_bytes) + " bytes needs";
}

}  // namespace kiln
