#include "core/fault_guard.h"

#include <lmdb.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace kiln {
namespace {

// Threads inside a guarded region right now. The handlers look at their
// thread-local state only when it is non-zero: a thread that never entered
// a region may not have its thread-local block yet, and making one inside
// a signal handler could call malloc.
std::atomic<int> g_guarded{0};
struct sigaction g_prev_bus, g_prev_segv;

thread_local internal::FaultScope* t_scope = nullptr;
// What ended the thread's last region: a signal and its address, or (sig
// 0) an LMDB assertion's text.
thread_local int t_signal = 0;
thread_local void* t_address = nullptr;
thread_local char t_assertion[256];

void Chain(int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = sig == SIGBUS ? g_prev_bus : g_prev_segv;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // The default action: put it back and let the fault happen again when
  // this returns (or raise a signal that another process sent).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(sig);
}

void OnFault(int sig, siginfo_t* info, void* context) {
  if (g_guarded.load(std::memory_order_acquire) > 0) {
    if (internal::FaultScope* scope = t_scope) {
      t_signal = sig;
      t_address = info != nullptr ? info->si_addr : nullptr;
      siglongjmp(scope->env, 1);
    }
  }
  Chain(sig, info, context);
}

void InstallHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = OnFault;
    // SA_NODEFER: the signal stays unblocked in the handler, so that a jump
    // out of it leaves the thread's mask unchanged (sigsetjmp saves none).
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_prev_bus);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
  });
}

void OnLmdbAssert(MDB_env*, const char* msg) {
  if (g_guarded.load(std::memory_order_acquire) > 0) {
    if (internal::FaultScope* scope = t_scope) {
      t_signal = 0;
      std::snprintf(t_assertion, sizeof t_assertion, "%s", msg);
      siglongjmp(scope->env, 1);
    }
  }
  // Outside a guarded region LMDB goes on as it always does: it prints the
  // assertion and aborts.
}

}  // namespace

namespace internal {

void EnterFaultScope(FaultScope* scope) {
  InstallHandlers();
  scope->outer = t_scope;
  t_scope = scope;
  g_guarded.fetch_add(1, std::memory_order_acq_rel);
}

void LeaveFaultScope(FaultScope* scope) {
  t_scope = scope->outer;
  g_guarded.fetch_sub(1, std::memory_order_acq_rel);
}

std::string TakeFaultDescription() {
  char buf[400];
  if (t_signal == SIGBUS) {
    std::snprintf(buf, sizeof buf,
                  "a read of the shard's memory map failed (SIGBUS at %p): the file was "
                  "truncated or became unreadable while it was open",
                  t_address);
  } else if (t_signal == SIGSEGV) {
    std::snprintf(buf, sizeof buf,
                  "reading the shard led outside its memory map (SIGSEGV at %p): its LMDB "
                  "pages were changed while it was open",
                  t_address);
  } else {
    std::snprintf(buf, sizeof buf,
                  "LMDB found its pages inconsistent (%s): the file was changed while it was open",
                  t_assertion);
  }
  t_signal = 0;
  return buf;
}

}  // namespace internal

void RouteLmdbAssertions(void* env) {
  mdb_env_set_assert(static_cast<MDB_env*>(env), OnLmdbAssert);
}

}  // namespace kiln
