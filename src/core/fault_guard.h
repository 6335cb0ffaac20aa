// Fault guard (internal): a read of a memory-mapped shard that faults, or an
// LMDB assertion that fails, ends the read with an error instead of ending
// the process.
//
// Readers copy records straight out of the shards' memory maps. If another
// process truncates a shard while it is mapped, touching a page past the
// new end raises SIGBUS; if it overwrites pages, LMDB may follow a damaged
// page number out of the map (SIGSEGV) or fail one of its assertions
// (abort). kiln verify proves a shard before reading it, and every reader
// checks the tree when it opens the cache - but a file can change after
// that. Code that reads the maps while the cache may change under it (the
// loader's copies and its read-ahead lookups, kiln.Cache reads) runs inside
// GuardedRead: a SIGBUS or SIGSEGV raised by the calling thread during `fn`,
// or an LMDB assertion failing in it, jumps back out of `fn` and
// GuardedRead returns false, with what happened in *what.
//
// A fault in any other thread, or outside a guarded region, goes to the
// handler installed before kiln's (Python's faulthandler, a sanitizer's, or
// the default, which ends the process): kiln does not hide its own bugs.
//
// REQUIRES of `fn`: it holds no lock and owns no object with a destructor
// when it may fault (the jump skips destructors); whatever it was reading
// (an LMDB read transaction) must be reset after a failed call.
#ifndef KILN_SRC_CORE_FAULT_GUARD_H_
#define KILN_SRC_CORE_FAULT_GUARD_H_

#include <csetjmp>
#include <string>

namespace kiln {

namespace internal {
// The calling thread's jump target while it runs a guarded region, null
// otherwise; and what ended the last one (a signal's or LMDB's words).
struct FaultScope {
  sigjmp_buf env;
  FaultScope* outer = nullptr;  // an enclosing region of the same thread
};
void EnterFaultScope(FaultScope* scope);  // installs the handlers once per process
void LeaveFaultScope(FaultScope* scope);
// Describes the fault that jumped out of the thread's innermost region.
std::string TakeFaultDescription();
}  // namespace internal

// Runs fn(); returns true if it finished, false if a fault or an LMDB
// assertion in this thread ended it early (*what says which).
template <typename Fn>
bool GuardedRead(Fn&& fn, std::string* what) {
  internal::FaultScope scope;
  internal::EnterFaultScope(&scope);
  // sigsetjmp without saving the mask: the handlers run with SA_NODEFER, so
  // a jump out of one leaves the thread's signal mask as it was.
  if (sigsetjmp(scope.env, 0) != 0) {
    internal::LeaveFaultScope(&scope);
    if (what != nullptr) *what = internal::TakeFaultDescription();
    return false;
  }
  fn();
  internal::LeaveFaultScope(&scope);
  return true;
}

// Makes LMDB report its failed assertions to the guard (mdb_env_set_assert):
// inside a guarded region they end the region; elsewhere LMDB prints and
// aborts as it always did. `env` is an MDB_env*.
void RouteLmdbAssertions(void* env);

}  // namespace kiln

#endif  // KILN_SRC_CORE_FAULT_GUARD_H_
