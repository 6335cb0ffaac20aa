// CheckLmdbFile (internal): proves that a shard file's LMDB pages are what
// LMDB's read path trusts them to be, before LMDB maps the file.
//
// LMDB does not check its own pages when it reads: a damaged page offset,
// child page number or overflow length sends it (or the caller reading the
// value it returns) outside the page or past the end of the file - a
// segfault, a SIGBUS, or an assertion that aborts the process. Flipping
// bytes in the page headers of a kiln shard made `kiln verify` crash in 14
// of 200 tries. kiln verify therefore walks the file with pread() first,
// following the B-tree from the meta page LMDB would pick, and hands the
// shard to LMDB only if every page it would touch is sound.
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
// key and value extents, each page reached once - and the first page of
// every overflow value (number, type, length inside the file); the count
// of entries. Returns Corruption naming the file and the page, IOError if
// it cannot be read.
Status CheckLmdbFile(const std::string& path, uint64_t file_bytes, LmdbFileSummary* out);

// The part of CheckLmdbFile that reads only the two meta pages (the tree's
// root, depth, flags and last page): two small reads, cheap enough for
// every CacheReader::Open. Damage inside the tree is left to CheckLmdbFile.
Status CheckLmdbMeta(const std::string& path, uint64_t file_bytes);

}  // namespace kiln

#endif  // KILN_SRC_CORE_LMDB_CHECK_H_
