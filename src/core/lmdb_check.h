// CheckLmdbFile (internal): proves that a shard file's LMDB pages are what
// LMDB's read path trusts them to be, before LMDB maps the file.
//
// LMDB does not check its own pages when it reads: a damaged page offset,
// child page number or overflow length sends it (or the caller reading the
// value it returns) outside the page or past the end of the file - a
// segfault, a SIGBUS, or an assertion that aborts the process. Flipping
// bytes in the page headers of a kiln shard made `kiln verify` crash in 14
// of 200 tries, and `kiln bench` and kiln.Loader in 2 of 150 when only the
// meta pages were checked. Every reader therefore walks the file with
// pread() first (kiln verify and CacheReader::Open), following
// the B-tree from the meta page LMDB would pick, and hands the shard to
// LMDB only if every page it would touch is sound.
//
// The layout checked is LMDB 0.9's on-disk format (mdb.c: MDB_meta, MDB_page,
// MDB_node), unchanged since 0.9.0 and the one Debian's liblmdb writes.
#ifndef KILN_SRC_CORE_LMDB_CHECK_H_
#define KILN_SRC_CORE_LMDB_CHECK_H_

#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln {

// What the walk found in a sound file.
struct LmdbFileSummary {
  uint64_t page_size = 0;
  uint64_t entries = 0;     // key/value pairs in the main database
  uint64_t tree_pages = 0;  // branch and leaf pages read
  uint32_t depth = 0;
};

// Checks the LMDB file `path` of `file_bytes` bytes (the caller's stat):
// both meta pages, the newest one where LMDB's readers look for it (with a
// lock file they take page `txnid & 1`, without one the larger txnid - a
// libFuzzer find) and its last page inside the file; a main
// database with kiln's flags (none); every branch and leaf page reachable
// from its root - page number, type for its depth, bounds, node offsets,
// key and value extents, each page reached once - and the pages of every
// overflow value inside the file, by arithmetic alone (its first page
// number and the count its size needs, every page claimed once: LMDB reads
// a value through its node, never through the overflow page's header; kiln
// verify checks that header with OverflowHeaderProblem where it reads the
// value); the count of entries and pages against the meta page's. Reads
// every tree page (leaves that follow each other in the file 32 at a time):
// a few hundred pages for 20,000 float16 3x224x224 records, but the whole
// file when records are small enough to sit in leaf pages (under about
// 2 KB). Returns Corruption naming the file and the page, IOError if it
// cannot be read.
Status CheckLmdbFile(const std::string& path, uint64_t file_bytes, LmdbFileSummary* out);

// The header of an overflow value's first page, `header` (its first 16
// bytes), for page `pgno` holding a value of `value_bytes` in a file of
// `page_size`-byte pages: "" when it is the overflow page LMDB wrote (its page
// number, its type, at least the pages the value needs), else what is wrong,
// e.g. "not the overflow page of 2 pages that a value of 6160 bytes needs".
// LMDB reads a value without looking at this header (only kiln verify asks).
std::string OverflowHeaderProblem(const uint8_t* header, uint64_t pgno, uint64_t value_bytes,
                                  uint64_t page_size);

}  // namespace kiln

#endif  // KILN_SRC_CORE_LMDB_CHECK_H_
