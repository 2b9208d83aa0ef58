// metalforge.sim execution engine (built once per compiler into
// libmf_sim_engine.so and loaded RTLD_GLOBAL before kernel libraries).
//
// Model
// - A launch is a dispatchThreads(grid, group) call.  Threadgroups are handed
//   to up to `nworkers` OS threads, one group at a time per worker.
// - Inside a group every GPU thread is a fiber with its own stack (guard page
//   below it; stacks are pooled per worker slot and reused across groups and
//   launches).  A fiber runs until it finishes or blocks at a barrier or a
//   simd/quad collective.
// - When no fiber of the group can run: collectives resolve first (per
//   simdgroup, per call site; participants are the lanes waiting at that call
//   site, every other lane is inactive, as on the GPU); then simdgroup
//   barriers (every live lane of the simdgroup at the same simdgroup_barrier);
//   then the threadgroup barrier (every live thread at the same
//   threadgroup_barrier).  Anything else is divergence, reported with the
//   threads' ids and where each one waits; the launch fails, never hangs.
//   Runnable fibers run in thread order, or last first with kReverseOrder (a
//   launch flag): a kernel missing a barrier reads what other threads have not
//   written yet in one order or the other (testing.check draws the order).
//   With kExitedLeaveBarriers (a launch flag), threads that have returned no
//   longer take part in barriers, as on Apple GPUs (MLX's gemv relies on it):
//   a barrier then resolves once every thread that has not returned waits at it.
// - With kRaceCheck (a launch flag, on unless sim.race_detection(False)), every
//   access of a kernel to threadgroup memory goes through the race detector
//   (race.h): the hooks the compiler's -fsanitize=thread instrumentation calls
//   are defined below; threadgroup barriers start a new epoch, simdgroup
//   barriers and collectives are simd events; a race fails the launch (code 4).
// - Faults (SIGSEGV/SIGBUS/SIGFPE/SIGILL) in a worker are caught on an
//   alternate signal stack and siglongjmp back to the worker; faults anywhere
//   else go to the handler that was installed before the launch.
//
// Thread positions for partial edge threadgroups (dispatchThreads on a grid the
// group size does not divide): Apple, "Calculating threadgroup and grid sizes"
// (developer.apple.com/documentation/metal/calculating-threadgroup-and-grid-sizes)
// says Metal then makes smaller threadgroups along the grid's edges.  The GPU
// keeps two values for them (Mesa's Apple-GPU backend, src/asahi/compiler,
// lists separate special registers for threads_per_threadgroup and
// dispatch_threads_per_threadgroup): threads_per_threadgroup is the actual
// (smaller) size of this group and dispatch_threads_per_threadgroup the size
// from the dispatch.  thread_index_in_threadgroup linearises with the actual
// size; simdgroups_per_threadgroup = ceil(actual threads / 32);
// threads_per_simdgroup is the execution width, 32.
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cxxabi.h>
#include <dlfcn.h>

#include <atomic>
#include <string>
#include <vector>

#define MF_SIM_ENGINE 1
#include "runtime.h"
#include "race.h"

// Result record shared with Python (ctypes mirror in metalforge/sim/library.py).
struct Result {
  int32_t code;        // 0 ok, 1 divergence, 2 fault, 3 engine error, 4 threadgroup-memory race,
                       // 5 undefined collective (a shuffle from a lane outside the simdgroup)
  int32_t signo;
  int32_t is_write;    // 1 write, 0 read, -1 unknown
  int32_t pad;
  uint64_t fault_addr;
  uint32_t group[3];   // threadgroup_position_in_grid of the failing group
  uint32_t thread[3];  // thread_position_in_grid of the faulting thread
  char message[8192];
};

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

constexpr unsigned kSimdWidth = 32;
constexpr unsigned kMaxGroup = 1024;
constexpr size_t kStackSize = 256 * 1024;  // per fiber (virtual; pages on demand)
constexpr int kMaxWorkers = 16;
constexpr int kExitedLeaveBarriers = 1;  // launch flag (mirrored in metalforge/sim/library.py)
constexpr int kReverseOrder = 2;         // launch flag: a group's runnable fibers run last first
constexpr int kRaceCheck = 4;            // launch flag: check threadgroup memory for races (race.h)
constexpr int kFillShift = 3;            // launch flags 8 and 16: what threadgroup memory holds
                                         // when the first group starts (tg_fill below)

enum State : int { RUN = 0, DONE = 1, WAIT_TG = 2, WAIT_SG = 3, WAIT_COLL = 4 };

struct Worker;

struct Fiber {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
  int state = DONE;
  const char* file = nullptr;
  unsigned line = 0, col = 0;
  const char* what = nullptr;
  mf::CollSlot* slot = nullptr;
  int quad = 0;
  Worker* worker = nullptr;
  char* stack_lo = nullptr;  // lowest usable byte (guard page just below)
  mf::Pos pos;
};

typedef void (*Entry)(void* const* bufs, const mf::Pos* pos);

struct Launch {
  Entry entry;
  void* const* bufs;
  uint32_t grid[3], group[3], ngroups[3];
  uint64_t total_groups;
  std::atomic<uint64_t> next{0};
  std::atomic<int> failed{0};
  int flags = 0;
  pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
  Result* res;
};

struct Worker {
  int slot = 0;
  Launch* launch = nullptr;
#if defined(__x86_64__)
  void* sched_sp = nullptr;
#else
  ucontext_t sched_uc;
#endif
  Fiber* fibers = nullptr;  // kMaxGroup, from the pool
  Fiber* current = nullptr;
  unsigned n = 0;           // threads in the current group
  sigjmp_buf jb;
  volatile int in_kernel = 0;
  // fault record
  int fault_sig = 0;
  int fault_code = 0;       // si_code (FPE_INTDIV, ...)
  void* fault_addr = nullptr;
  int fault_write = -1;
  Fiber* fault_fiber = nullptr;
  mf_race::Detector* race = nullptr;  // set for launches with kRaceCheck
  // Threadgroup arrays this worker's groups have declared (their storage is the worker's, one
  // copy per OS thread) and the group that last filled each (tg_fill): every group finds its
  // arrays filled, whatever earlier groups left there (mf_rt_tg_note).
  uint64_t group_serial = 0;
  int fill = 0;             // the current group's fill (tg_fill)
  std::vector<std::pair<uintptr_t, uint64_t>> tg_filled;
};

thread_local Worker* tl_worker = nullptr;

}  // namespace


// ---------------------------------------------------------------- context switch
#if defined(__x86_64__)
extern "C" void mf_ctx_switch(void** save_sp, void* load_sp);
extern "C" void mf_fiber_trampoline();
asm(R"(
  .text
  .globl mf_ctx_switch
  .type mf_ctx_switch,@function
mf_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mf_ctx_switch, .-mf_ctx_switch

  .globl mf_fiber_trampoline
  .type mf_fiber_trampoline,@function
mf_fiber_trampoline:
  movq %r12, %rdi
  andq $-16, %rsp
  call mf_fiber_main
  ud2
  .size mf_fiber_trampoline, .-mf_fiber_trampoline
)");
#endif

extern "C" void mf_fiber_main(Fiber* f);

namespace {

void switch_to_fiber(Worker* w, Fiber* f) {
  w->current = f;
#if defined(__x86_64__)
  mf_ctx_switch(&w->sched_sp, f->sp);
#else
  swapcontext(&w->sched_uc, &f->uc);
#endif
  w->current = nullptr;
}

void switch_to_scheduler(Fiber* f) {
  Worker* w = f->worker;
#if defined(__x86_64__)
  mf_ctx_switch(&f->sp, w->sched_sp);
#else
  swapcontext(&f->uc, &w->sched_uc);
#endif
}

void init_fiber(Fiber* f) {
#if defined(__x86_64__)
  uintptr_t top = (uintptr_t)(f->stack_lo + kStackSize) & ~(uintptr_t)15;
  void** sp = (void**)top;
  *--sp = nullptr;                         // alignment pad
  *--sp = (void*)&mf_fiber_trampoline;     // return address of mf_ctx_switch
  *--sp = nullptr;                         // rbp
  *--sp = nullptr;                         // rbx
  *--sp = (void*)f;                        // r12 -> first argument
  *--sp = nullptr;                         // r13
  *--sp = nullptr;                         // r14
  *--sp = nullptr;                         // r15
  --sp;                                    // mxcsr + x87 control word
  uint32_t* ctl = (uint32_t*)sp;
  ctl[0] = 0x1F80;                         // default MXCSR
  ctl[1] = 0x037F;                         // default x87 control word
  f->sp = sp;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack_lo;
  f->uc.uc_stack.ss_size = kStackSize;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, (void (*)())mf_fiber_main, 1, f);
#endif
}

// ---------------------------------------------------------------- stack pool
pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
Fiber* g_pool[kMaxWorkers] = {nullptr};
size_t g_page = 4096;

Fiber* pool_fibers(int slot) {
  pthread_mutex_lock(&g_pool_mu);
  if (!g_pool[slot]) {
    Fiber* fs = new Fiber[kMaxGroup];
    size_t one = kStackSize + g_page;
    char* base = (char*)mmap(nullptr, one * kMaxGroup, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      pthread_mutex_unlock(&g_pool_mu);
      delete[] fs;
      return nullptr;
    }
    for (unsigned i = 0; i < kMaxGroup; ++i) {
      char* lo = base + i * one;
      mprotect(lo, g_page, PROT_NONE);  // guard page below the stack
      fs[i].stack_lo = lo + g_page;
    }
    g_pool[slot] = fs;
  }
  Fiber* r = g_pool[slot];
  pthread_mutex_unlock(&g_pool_mu);
  return r;
}

// One race detector per worker slot (its clocks are 128 KiB: allocated once, reused).
mf_race::Detector g_detectors[kMaxWorkers];
// The hull of every threadgroup array registered in the running launch (all workers): the
// memory-access hooks return at once for an address outside it (device buffers, the fibers'
// stacks), without reading the worker's thread-local state.  Empty outside race-checked
// launches.  Only ever widened during a launch, and each worker widens it with its own arrays
// before it accesses them, so a worker always sees its own arrays inside.
std::atomic<uintptr_t> g_tg_lo{UINTPTR_MAX}, g_tg_hi{0};

void widen_tg_hull(uintptr_t lo, uintptr_t hi) {
  uintptr_t cur = g_tg_lo.load(std::memory_order_relaxed);
  while (lo < cur && !g_tg_lo.compare_exchange_weak(cur, lo, std::memory_order_relaxed)) {}
  cur = g_tg_hi.load(std::memory_order_relaxed);
  while (hi > cur && !g_tg_hi.compare_exchange_weak(cur, hi, std::memory_order_relaxed)) {}
}

bool in_stack_guard(void* addr) {
  uintptr_t a = (uintptr_t)addr;
  for (int s = 0; s < kMaxWorkers; ++s) {
    Fiber* fs = g_pool[s];
    if (!fs) continue;
    for (unsigned i = 0; i < kMaxGroup; ++i) {
      uintptr_t lo = (uintptr_t)fs[i].stack_lo;
      if (a >= lo - g_page && a < lo) return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------- messages
void appendf(std::string& s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& s, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s += buf;
}

std::string ranges(const std::vector<unsigned>& ids) {
  std::string s;
  size_t i = 0;
  while (i < ids.size()) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ",";
    if (j == i)
      appendf(s, "%u", ids[i]);
    else
      appendf(s, "%u-%u", ids[i], ids[j]);
    i = j + 1;
  }
  return s;
}

const char* basename_of(const char* f) {
  if (!f) return "?";
  const char* b = strrchr(f, '/');
  return b ? b + 1 : f;
}

std::string describe_wait(const Fiber& f) {
  std::string s;
  switch (f.state) {
    case DONE: return "have returned";
    case WAIT_TG: s = "wait at threadgroup_barrier"; break;
    case WAIT_SG: s = "wait at simdgroup_barrier"; break;
    case WAIT_COLL: s = std::string("wait at ") + (f.what ? f.what : "a simd collective"); break;
    default: return "are running";
  }
  appendf(s, " (%s:%u:%u)", basename_of(f.file), f.line, f.col);
  return s;
}

bool same_site(const Fiber& a, const Fiber& b) {
  return a.state == b.state && a.line == b.line && a.col == b.col &&
         (a.file == b.file || (a.file && b.file && strcmp(a.file, b.file) == 0));
}

void fail(Worker* w, int code, const std::string& msg) {
  Launch* L = w->launch;
  pthread_mutex_lock(&L->err_mu);
  if (!L->failed.load()) {
    L->res->code = code;
    snprintf(L->res->message, sizeof L->res->message, "%s", msg.c_str());
    L->failed.store(1);
  }
  pthread_mutex_unlock(&L->err_mu);
}

// Describe the threads in fibers[lo, hi) grouped by what they are doing.
std::string divergence_report(Worker* w, unsigned lo, unsigned hi, const char* scope) {
  std::vector<unsigned> seen(hi - lo, 0);
  std::string s;
  const uint32_t* g = w->fibers[lo].pos.threadgroup_position_in_grid;
  appendf(s, "%s in threadgroup (%u,%u,%u): ", scope, g[0], g[1], g[2]);
  bool first = true;
  for (unsigned i = lo; i < hi; ++i) {
    if (seen[i - lo]) continue;
    std::vector<unsigned> ids;
    for (unsigned j = i; j < hi; ++j) {
      if (!seen[j - lo] && (w->fibers[j].state == w->fibers[i].state) &&
          (w->fibers[i].state == DONE || same_site(w->fibers[i], w->fibers[j]))) {
        seen[j - lo] = 1;
        ids.push_back(w->fibers[j].pos.thread_index_in_threadgroup[0]);
      }
    }
    if (!first) s += "; ";
    first = false;
    appendf(s, "threads %s %s", ranges(ids).c_str(), describe_wait(w->fibers[i]).c_str());
  }
  s += " (thread ids are thread_index_in_threadgroup)";
  return s;
}

// ---------------------------------------------------------------- one group
void set_positions(Launch* L, Worker* w, const uint32_t gp[3]) {
  uint32_t act[3];
  for (int d = 0; d < 3; ++d) {
    uint32_t start = gp[d] * L->group[d];
    uint32_t rem = L->grid[d] - start;
    act[d] = rem < L->group[d] ? rem : L->group[d];
  }
  unsigned n = act[0] * act[1] * act[2];
  w->n = n;
  unsigned nsg = (n + kSimdWidth - 1) / kSimdWidth;
  unsigned dispatch_n = L->group[0] * L->group[1] * L->group[2];
  unsigned i = 0;
  for (uint32_t z = 0; z < act[2]; ++z)
    for (uint32_t y = 0; y < act[1]; ++y)
      for (uint32_t x = 0; x < act[0]; ++x, ++i) {
        mf::Pos& p = w->fibers[i].pos;
        uint32_t l[3] = {x, y, z};
        for (int d = 0; d < 3; ++d) {
          p.thread_position_in_threadgroup[d] = l[d];
          p.threadgroup_position_in_grid[d] = gp[d];
          p.thread_position_in_grid[d] = gp[d] * L->group[d] + l[d];
          p.threads_per_threadgroup[d] = act[d];
          p.threadgroups_per_grid[d] = L->ngroups[d];
          p.threads_per_grid[d] = L->grid[d];
          p.dispatch_threads_per_threadgroup[d] = L->group[d];
          p.grid_origin[d] = 0;
        }
        auto set1 = [](uint32_t* v, uint32_t a) { v[0] = a; v[1] = 0; v[2] = 0; };
        set1(p.thread_index_in_threadgroup, i);
        set1(p.thread_index_in_simdgroup, i % kSimdWidth);
        set1(p.simdgroup_index_in_threadgroup, i / kSimdWidth);
        set1(p.threads_per_simdgroup, kSimdWidth);
        set1(p.simdgroups_per_threadgroup, nsg);
        set1(p.dispatch_simdgroups_per_threadgroup, (dispatch_n + kSimdWidth - 1) / kSimdWidth);
        set1(p.thread_execution_width, kSimdWidth);
        set1(p.thread_index_in_quadgroup, i % 4);
        set1(p.quadgroup_index_in_threadgroup, i / 4);
        set1(p.quadgroups_per_threadgroup, (n + 3) / 4);
        set1(p.dispatch_quadgroups_per_threadgroup, (dispatch_n + 3) / 4);
      }
}

bool uninit_reported(Worker* w);

// Resolve what can be resolved once no fiber can run.  Returns 1 when some
// fiber became runnable, 0 when the group finished, -1 on divergence or a read of threadgroup
// memory no thread wrote.
int resolve_blocked(Worker* w) {
  unsigned n = w->n;
  Fiber* fs = w->fibers;
  bool all_done = true;
  for (unsigned i = 0; i < n; ++i)
    if (fs[i].state != DONE) { all_done = false; break; }
  if (all_done) return uninit_reported(w) ? -1 : 0;
  const bool skip_done = w->launch->flags & kExitedLeaveBarriers;

  bool progress = false;
  // 1. collectives, per simdgroup and call site
  for (unsigned base = 0; base < n; base += kSimdWidth) {
    unsigned end = base + kSimdWidth < n ? base + kSimdWidth : n;
    for (unsigned i = base; i < end; ++i) {
      if (fs[i].state != WAIT_COLL) continue;
      mf::CollSlot* lanes[kSimdWidth] = {nullptr};
      for (unsigned j = i; j < end; ++j)
        if (fs[j].state == WAIT_COLL && same_site(fs[i], fs[j])) lanes[j - base] = fs[j].slot;
      fs[i].slot->resolve(lanes, fs[i].quad ? 4 : kSimdWidth);
      if (w->race) {
        uint32_t mask = 0;   // the lanes that meet here, and those that have returned
        for (unsigned j = base; j < end; ++j)
          if (lanes[j - base] || fs[j].state == DONE) mask |= 1u << (j - base);
        w->race->simd_event(base / kSimdWidth, mask, end - base);
      }
      for (unsigned j = end; j-- > i;)
        if (lanes[j - base]) fs[j].state = RUN;
      progress = true;
    }
  }
  if (progress) return 1;
  // 2. simdgroup barriers
  for (unsigned base = 0; base < n; base += kSimdWidth) {
    unsigned end = base + kSimdWidth < n ? base + kSimdWidth : n;
    int first = -1;
    for (unsigned i = base; i < end; ++i)
      if (fs[i].state == WAIT_SG) { first = (int)i; break; }
    if (first < 0) continue;
    for (unsigned i = base; i < end; ++i)
      if (!same_site(fs[i], fs[first]) && !(skip_done && fs[i].state == DONE))
        return fail(w, 1, divergence_report(w, base, end, "simdgroup_barrier divergence")), -1;
    for (unsigned i = base; i < end; ++i)
      if (fs[i].state != DONE) fs[i].state = RUN;
    if (w->race) w->race->simd_event(base / kSimdWidth, 0xFFFFFFFFu, end - base);
    progress = true;
  }
  if (progress) return 1;
  // 3. threadgroup barrier
  unsigned first = 0;
  while (skip_done && fs[first].state == DONE) ++first;  // some fiber is not done
  for (unsigned i = 0; i < n; ++i)
    if (!(fs[i].state == WAIT_TG && same_site(fs[i], fs[first])) &&
        !(skip_done && fs[i].state == DONE))
      return fail(w, 1, divergence_report(w, 0, n, "threadgroup_barrier divergence")), -1;
  if (uninit_reported(w)) return -1;
  for (unsigned i = 0; i < n; ++i)
    if (fs[i].state != DONE) fs[i].state = RUN;
  if (w->race) w->race->barrier();
  return 1;
}

bool run_group(Worker* w, const uint32_t gp[3]) {
  Launch* L = w->launch;
  set_positions(L, w, gp);
  unsigned n = w->n;
  ++w->group_serial;
  const uint64_t linear = gp[0] + (uint64_t)L->ngroups[0] * (gp[1] + L->ngroups[1] * gp[2]);
  w->fill = (int)((linear + ((L->flags >> kFillShift) & 3)) % 3);   // tg_fill's kinds
  if (w->race) w->race->start_group(n);
  for (unsigned i = 0; i < n; ++i) {
    Fiber* f = &w->fibers[i];
    f->worker = w;
    f->state = RUN;
    init_fiber(f);
  }
  const bool reverse = L->flags & kReverseOrder;
  for (;;) {
    for (unsigned k = 0; k < n; ++k) {
      Fiber* f = &w->fibers[reverse ? n - 1 - k : k];
      if (f->state == RUN) switch_to_fiber(w, f);
      if (L->failed.load(std::memory_order_relaxed)) return false;  // e.g. a race in f
    }
    int r = resolve_blocked(w);
    if (r == 0) return true;
    if (r < 0) return false;
  }
}

// ---------------------------------------------------------------- signals
const int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction g_old[65];
pthread_mutex_t g_launch_mu = PTHREAD_MUTEX_INITIALIZER;

void on_fault(int sig, siginfo_t* si, void* ucv) {
  Worker* w = tl_worker;
  if (w && w->in_kernel) {
    w->in_kernel = 0;
    w->fault_sig = sig;
    w->fault_code = si->si_code;
    w->fault_addr = si->si_addr;
    w->fault_fiber = w->current;
#if defined(__x86_64__) && defined(REG_ERR)
    ucontext_t* uc = (ucontext_t*)ucv;
    if (sig == SIGSEGV) w->fault_write = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
#else
    (void)ucv;
#endif
    siglongjmp(w->jb, 1);
  }
  // Not ours: hand it to whoever handled it before the launch.
  struct sigaction* old = &g_old[sig];
  if (old->sa_flags & SA_SIGINFO) {
    if (old->sa_sigaction) old->sa_sigaction(sig, si, ucv);
    return;
  }
  if (old->sa_handler == SIG_IGN) return;
  if (old->sa_handler == SIG_DFL) {
    sigaction(sig, old, nullptr);  // the faulting instruction re-runs under the default action
    return;
  }
  old->sa_handler(sig);
}

void install_handlers() {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int s : kSignals) sigaction(s, &sa, &g_old[s]);
}

void restore_handlers() {
  for (int s : kSignals) sigaction(s, &g_old[s], nullptr);
}

const char* signame(int s) {
  switch (s) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (arithmetic fault, e.g. integer division by zero)";
    case SIGILL: return "SIGILL (illegal instruction)";
  }
  return "signal";
}

// The function holding code address `pc` (demangled, with its parameter types), "" if unknown.
std::string function_at(void* pc) {
  Dl_info info;
  if (!dladdr(pc, &info) || !info.dli_sname) return "";
  int status = 0;
  char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::string name = status == 0 && d ? d : info.dli_sname;
  free(d);
  return name;
}

// What a fault was, for the report: an integer division fault is named as such, with the
// function where it happened (for SIGFPE, si_addr is the faulting instruction).
std::string describe_fault(Worker* w) {
  std::string m;
  if (w->fault_sig == SIGFPE && (w->fault_code == FPE_INTDIV || w->fault_code == FPE_INTOVF)) {
    m = "SIGFPE: integer division or remainder by zero (or of the most negative value by -1; "
        "undefined on a GPU, a fault on the CPU)";
    std::string fn = function_at(w->fault_addr);
    if (!fn.empty()) m += " in " + fn;
    return m;
  }
  if (w->fault_sig == SIGILL) {      // the bounds check the compiler adds (-fsanitize=bounds)
    m = "an array index out of bounds (a thread-private or threadgroup array of known size, "
        "or a vector's component: the simulator checks every index into one)";
    std::string fn = function_at(w->fault_addr);
    if (!fn.empty()) m += " in " + fn;
    return m;
  }
  appendf(m, "%s at address %p", signame(w->fault_sig), w->fault_addr);
  return m;
}

void* worker_main(void* arg) {
  Worker* w = (Worker*)arg;
  Launch* L = w->launch;
  tl_worker = w;
  stack_t ss, old_ss;
  ss.ss_size = 256 * 1024;
  ss.ss_sp = malloc(ss.ss_size);
  ss.ss_flags = 0;
  sigaltstack(&ss, &old_ss);
  w->fibers = pool_fibers(w->slot);
  if (L->flags & kRaceCheck) {
    w->race = &g_detectors[w->slot];
    w->race->start_launch();
  }
  if (!w->fibers) {
    fail(w, 3, "could not allocate fiber stacks (mmap failed)");
  } else if (sigsetjmp(w->jb, 1) == 0) {
    for (;;) {
      if (L->failed.load(std::memory_order_relaxed)) break;
      uint64_t g = L->next.fetch_add(1);
      if (g >= L->total_groups) break;
      uint32_t gp[3];
      gp[0] = (uint32_t)(g % L->ngroups[0]);
      gp[1] = (uint32_t)((g / L->ngroups[0]) % L->ngroups[1]);
      gp[2] = (uint32_t)(g / ((uint64_t)L->ngroups[0] * L->ngroups[1]));
      w->in_kernel = 1;
      bool ok = run_group(w, gp);
      w->in_kernel = 0;
      if (!ok) break;
    }
  } else {
    // A fault (we are back on the worker's own stack).
    std::string m;
    Fiber* f = w->fault_fiber;
    pthread_mutex_lock(&L->err_mu);
    if (!L->failed.load()) {
      Result* r = L->res;
      r->code = 2;
      r->signo = w->fault_sig;
      r->is_write = w->fault_write;
      r->fault_addr = (uint64_t)(uintptr_t)w->fault_addr;
      if (f) {
        memcpy(r->group, f->pos.threadgroup_position_in_grid, sizeof r->group);
        memcpy(r->thread, f->pos.thread_position_in_grid, sizeof r->thread);
        appendf(m, "%s in thread_position_in_grid (%u,%u,%u)", describe_fault(w).c_str(),
                f->pos.thread_position_in_grid[0],
                f->pos.thread_position_in_grid[1], f->pos.thread_position_in_grid[2]);
        if (in_stack_guard(w->fault_addr))
          m += ": stack overflow (the thread used more than 256 KiB of stack)";
      } else {
        appendf(m, "%s in the simulator's scheduler", describe_fault(w).c_str());
      }
      snprintf(r->message, sizeof r->message, "%s", m.c_str());
      L->failed.store(1);
    }
    pthread_mutex_unlock(&L->err_mu);
  }
  stack_t off;
  memset(&off, 0, sizeof off);
  off.ss_flags = SS_DISABLE;
  sigaltstack(&off, nullptr);
  free(ss.ss_sp);
  tl_worker = nullptr;
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------- fiber side
extern "C" void mf_fiber_main(Fiber* f) {
  for (;;) {
    Launch* L = f->worker->launch;
    L->entry(L->bufs, &f->pos);
    f->state = DONE;
    switch_to_scheduler(f);
  }
}

extern "C" void mf_rt_barrier(int simd, const char* file, unsigned line, unsigned col) {
  Worker* w = tl_worker;
  if (!w || !w->current) return;  // not inside a launch
  Fiber* f = w->current;
  f->state = simd ? WAIT_SG : WAIT_TG;
  f->file = file;
  f->line = line;
  f->col = col;
  f->what = nullptr;
  switch_to_scheduler(f);
}

extern "C" const mf::Pos* mf_rt_position() {
  static const mf::Pos outside{};   // not inside a launch: thread 0 of everything
  Worker* w = tl_worker;
  return (w && w->current) ? &w->current->pos : &outside;
}

extern "C" void mf_rt_stray_lane(const char* what, long long lane, unsigned width,
                                 const char* file, unsigned line) {
  Worker* w = tl_worker;
  if (!w || !w->current) return;  // not inside a launch: nothing to fail
  Fiber* f = w->current;
  std::string m;
  appendf(m, "%s at %s:%u: thread_position_in_grid (%u,%u,%u) named source lane %lld, but a "
          "%s has lanes 0 to %u (Metal leaves the value undefined; CUDA's shuffle wraps to lane "
          "%lld): keep the lane inside", what, basename_of(file), line,
          f->pos.thread_position_in_grid[0], f->pos.thread_position_in_grid[1],
          f->pos.thread_position_in_grid[2], lane, width == 4 ? "quadgroup" : "simdgroup",
          width - 1, ((lane % (long long)width) + width) % width);
  fail(w, 5, m);
  f->state = DONE;           // never resumed: the launch has failed
  switch_to_scheduler(f);
}

extern "C" void mf_rt_collective(mf::CollSlot* slot, int quad, const char* what,
                                 const char* file, unsigned line, unsigned col) {
  Worker* w = tl_worker;
  if (!w || !w->current) {  // not inside a launch: act as a lone lane
    mf::CollSlot* lanes[kSimdWidth] = {slot};
    slot->resolve(lanes, quad ? 4 : kSimdWidth);
    return;
  }
  Fiber* f = w->current;
  f->state = WAIT_COLL;
  f->slot = slot;
  f->quad = quad;
  f->what = what;
  f->file = file;
  f->line = line;
  f->col = col;
  switch_to_scheduler(f);
}

// ---------------------------------------------------------------- race detector
namespace {

// "buf[3][5]" for shadow cell `c` of `a` (and which bytes of the element, when it is wider
// than a cell: a vector's component or a struct's field).
std::string element_name(const mf_race::Array& a, size_t c) {
  const size_t off = c * a.granule, elem = off / a.elem, within = off % a.elem;
  std::string s = a.name;
  if (a.ndims == 0) {
    if (a.end - a.base > a.elem) appendf(s, "[%zu]", elem);  // a pointer-cast view of a scalar
  } else {
    size_t idx[mf_race::kMaxDims], rest = elem;
    for (unsigned d = a.ndims; d-- > 0;) {
      idx[d] = a.dims[d] ? rest % a.dims[d] : rest;
      rest = a.dims[d] ? rest / a.dims[d] : 0;
    }
    for (unsigned d = 0; d < a.ndims; ++d) appendf(s, "[%zu]", idx[d]);
  }
  if (a.granule < a.elem)
    appendf(s, " (bytes %zu-%zu of the element)", within, within + a.granule - 1);
  return s;
}

std::string thread_name(unsigned tid) {
  std::string s;
  appendf(s, "thread %u (simdgroup %u, lane %u)", tid, tid / kSimdWidth, tid % kSimdWidth);
  return s;
}

std::string where(const void* pc) {
  if (!pc) return "";
  std::string fn = function_at(const_cast<void*>(pc));
  if (fn.empty()) return "";
  if (fn.size() > 160 && fn.find('(') != std::string::npos)
    fn = fn.substr(0, fn.find('(')) + "(...)";   // the parameter list of a long name
  if (fn.size() > 160) fn = fn.substr(0, 157) + "...";
  return " in " + fn;
}

std::string race_message(Worker* w, const mf_race::Race& r) {
  static const char* kinds[] = {"read after write", "write after read", "write after write"};
  static const char* first_verb[] = {"wrote", "read", "wrote"};
  static const char* second_verb[] = {"reads", "writes", "writes"};
  const uint32_t* g = w->fibers[0].pos.threadgroup_position_in_grid;
  std::string m;
  if (r.kind == mf_race::UNINIT) {
    appendf(m, "read of threadgroup memory no thread wrote: %s reads %s%s, threadgroup array "
            "'%s' declared at %s:%u, in threadgroup (%u,%u,%u), and no thread of the threadgroup "
            "has written it since the group started. Threadgroup memory starts undefined on a "
            "GPU (what an earlier threadgroup left there): write every element before it is "
            "read, or guard the read. Thread ids are thread_index_in_threadgroup",
            thread_name(r.second_tid).c_str(), element_name(*r.array, r.cell).c_str(),
            where(r.second_pc).c_str(), r.array->name, basename_of(r.array->file),
            r.array->line, g[0], g[1], g[2]);
    return m;
  }
  appendf(m, "threadgroup memory race (%s) on %s, threadgroup array '%s' declared at %s:%u, "
          "in threadgroup (%u,%u,%u): ", kinds[r.kind],
          element_name(*r.array, r.cell).c_str(), r.array->name, basename_of(r.array->file),
          r.array->line, g[0], g[1], g[2]);
  const std::string f1 = where(r.first_pc), f2 = where(r.second_pc);
  m += thread_name(r.second_tid) + " " + second_verb[r.kind] + " it" + (f1 == f2 ? "" : f2) +
       " after " + thread_name(r.first_tid) + " " + first_verb[r.kind] + " it" +
       (f1 == f2 ? "" : f1) +
       " with nothing ordering the two: a threadgroup_barrier must separate them (lanes of one "
       "simdgroup are also ordered by simdgroup_barrier and simd collectives)";
  if (f1 == f2 && !f1.empty()) m += "; both accesses are" + f1;
  m += ". Thread ids are thread_index_in_threadgroup";
  return m;
}

// Fails the launch with the held read of threadgroup memory no thread wrote, if any (race.h):
// called at every threadgroup barrier and at the group's end.
bool uninit_reported(Worker* w) {
  if (!w->race || !w->race->uninit_read) return false;
  fail(w, 4, race_message(w, w->race->uninit));
  return true;
}

// The worker whose race detector covers [p, p + n) of threadgroup memory, if any (most
// accesses are to device memory: one compare against the hull of every worker's arrays).
inline Worker* tg_checked(uintptr_t a, size_t n) {
  if (__builtin_expect(a >= g_tg_hi.load(std::memory_order_relaxed) ||
                       a + n <= g_tg_lo.load(std::memory_order_relaxed), 1))
    return nullptr;
  Worker* w = tl_worker;
  if (!w || !w->race || !w->current || !w->race->covers(a, n)) return nullptr;
  return w;
}

// The hook behind every atomic that writes threadgroup memory (the UNINIT check's writes).
inline void atomic_written(const volatile void* p, size_t n) {
  if (Worker* w = tg_checked((uintptr_t)p, n)) w->race->atomic_written((uintptr_t)p, n);
}

// The hook behind every instrumented load and store of a kernel.
inline void race_access(const void* p, size_t n, bool write, const void* pc) {
  Worker* w = tg_checked((uintptr_t)p, n);
  if (!w) return;
  Fiber* f = w->current;
  const unsigned tid = (unsigned)(f - w->fibers);
  mf_race::Race r;
  if (w->race->access((uintptr_t)p, n, mf_race::Access{tid, write, pc}, &r)) return;
  fail(w, 4, race_message(w, r));
  f->state = DONE;           // never resumed: the launch has failed
  switch_to_scheduler(f);
}

}  // namespace

// What a threadgroup array holds when its group starts.  On Metal: whatever an earlier group (or
// kernel) left there.  Here, so that what a kernel reads before any thread wrote it shows, one
// of three fills: every byte 0xFF (0: a NaN in every float type, -1 in signed integers), or
// every 16-bit unit 0x7BFF (1: 65504 as half, 2.7e36 as float and bfloat, large positive
// integers) or 0xFBFF (2: the same, negative).  A NaN passes unnoticed through fmax/simd_max
// and comparisons, a large positive value through a min, a large negative one through a max:
// so the groups take the three in turn (group g, linearised, the fill g places after the
// launch's first, its flags), and a stray read changes a max, a min or a sum in some group.
static void tg_fill(void* base, size_t bytes, int kind) {
  if (kind == 0) {
    memset(base, 0xFF, bytes);
    return;
  }
  unsigned char* p = (unsigned char*)base;
  const unsigned char high = kind == 1 ? 0x7B : 0xFB;   // little-endian: 0xFF, then the sign
  for (size_t i = 0; i < bytes; ++i) p[i] = (i & 1) ? high : 0xFF;
}

extern "C" void mf_rt_tg_note(void* base, size_t bytes, unsigned granule, unsigned elem,
                              const unsigned* dims, unsigned ndims, const char* name,
                              const char* file, unsigned line) {
  Worker* w = tl_worker;
  if (!w || !w->current) return;
  // the first thread of the group to pass the declaration fills the array (none wrote it yet)
  size_t i = 0;
  while (i < w->tg_filled.size() && w->tg_filled[i].first != (uintptr_t)base) ++i;
  if (i == w->tg_filled.size()) w->tg_filled.emplace_back((uintptr_t)base, 0);
  if (w->tg_filled[i].second != w->group_serial) {
    tg_fill(base, bytes, w->fill);
    w->tg_filled[i].second = w->group_serial;
  }
  if (!w->race) return;
  w->race->note((uintptr_t)base, bytes, granule, elem, dims, ndims, name, file, line);
  widen_tg_hull((uintptr_t)base, (uintptr_t)base + bytes);
}

// The ThreadSanitizer instrumentation ABI (what -fsanitize=thread makes the compiler call),
// implemented here without its runtime: plain accesses go to the race detector, atomics are
// performed (sequentially consistent, stronger than any order asked for) and not checked.
#define MF_RACE_RA() __builtin_return_address(0)
#define MF_TSAN_RW(N)                                                                         \
  extern "C" void __tsan_read##N(void* p) { race_access(p, N, false, MF_RACE_RA()); }       \
  extern "C" void __tsan_write##N(void* p) { race_access(p, N, true, MF_RACE_RA()); }       \
  extern "C" void __tsan_unaligned_read##N(void* p) { race_access(p, N, false, MF_RACE_RA()); } \
  extern "C" void __tsan_unaligned_write##N(void* p) { race_access(p, N, true, MF_RACE_RA()); } \
  extern "C" void __tsan_volatile_read##N(void* p) { race_access(p, N, false, MF_RACE_RA()); } \
  extern "C" void __tsan_volatile_write##N(void* p) { race_access(p, N, true, MF_RACE_RA()); } \
  extern "C" void __tsan_read##N##_pc(void* p, void* pc) { race_access(p, N, false, pc); }  \
  extern "C" void __tsan_write##N##_pc(void* p, void* pc) { race_access(p, N, true, pc); }
MF_TSAN_RW(1)
MF_TSAN_RW(2)
MF_TSAN_RW(4)
MF_TSAN_RW(8)
MF_TSAN_RW(16)
#undef MF_TSAN_RW

extern "C" void __tsan_read_range(void* p, size_t n) { race_access(p, n, false, MF_RACE_RA()); }
extern "C" void __tsan_write_range(void* p, size_t n) { race_access(p, n, true, MF_RACE_RA()); }
extern "C" void* __tsan_memcpy(void* d, const void* s, size_t n) {
  race_access(s, n, false, MF_RACE_RA());
  race_access(d, n, true, MF_RACE_RA());
  return memcpy(d, s, n);
}
extern "C" void* __tsan_memmove(void* d, const void* s, size_t n) {
  race_access(s, n, false, MF_RACE_RA());
  race_access(d, n, true, MF_RACE_RA());
  return memmove(d, s, n);
}
extern "C" void* __tsan_memset(void* d, int c, size_t n) {
  race_access(d, n, true, MF_RACE_RA());
  return memset(d, c, n);
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
extern "C" void __tsan_ignore_thread_begin() {}
extern "C" void __tsan_ignore_thread_end() {}
extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// a read-modify-write `NAME` of width B (type T) through the builtin `BUILTIN`, and a compare
// and exchange `NAME` (weak ones as strong), each recorded as an atomic write
#define MF_TSAN_RMW(B, T, NAME, BUILTIN)                                                      \
  extern "C" T __tsan_atomic##B##_##NAME(volatile T* a, T v, int) {                          \
    atomic_written(a, sizeof(T));                                                             \
    return BUILTIN(a, v, __ATOMIC_SEQ_CST);                                                   \
  }
#define MF_TSAN_CAS(B, T, NAME)                                                               \
  extern "C" int __tsan_atomic##B##_compare_exchange_##NAME(volatile T* a, T* c, T v, int,   \
                                                           int) {                             \
    atomic_written(a, sizeof(T));                                                             \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }
#define MF_TSAN_ATOMIC(B, T)                                                                  \
  extern "C" T __tsan_atomic##B##_load(const volatile T* a, int) {                            \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                             \
  }                                                                                           \
  extern "C" void __tsan_atomic##B##_store(volatile T* a, T v, int) {                         \
    atomic_written(a, sizeof(T));                                                             \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                \
  }                                                                                           \
  MF_TSAN_RMW(B, T, exchange, __atomic_exchange_n)                                            \
  MF_TSAN_RMW(B, T, fetch_add, __atomic_fetch_add)                                            \
  MF_TSAN_RMW(B, T, fetch_sub, __atomic_fetch_sub)                                            \
  MF_TSAN_RMW(B, T, fetch_and, __atomic_fetch_and)                                            \
  MF_TSAN_RMW(B, T, fetch_or, __atomic_fetch_or)                                              \
  MF_TSAN_RMW(B, T, fetch_xor, __atomic_fetch_xor)                                            \
  MF_TSAN_RMW(B, T, fetch_nand, __atomic_fetch_nand)                                          \
  MF_TSAN_CAS(B, T, strong)                                                                   \
  MF_TSAN_CAS(B, T, weak)                                                                     \
  extern "C" T __tsan_atomic##B##_compare_exchange_val(volatile T* a, T c, T v, int, int) {   \
    atomic_written(a, sizeof(T));                                                             \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
    return c;                                                                                 \
  }
MF_TSAN_ATOMIC(8, uint8_t)
MF_TSAN_ATOMIC(16, uint16_t)
MF_TSAN_ATOMIC(32, uint32_t)
MF_TSAN_ATOMIC(64, uint64_t)
#undef MF_TSAN_ATOMIC
#undef MF_TSAN_CAS
#undef MF_TSAN_RMW
#undef MF_RACE_RA

// ---------------------------------------------------------------- launch
extern "C" int mf_rt_launch(Entry entry, void* const* bufs, const uint32_t* grid,
                            const uint32_t* group, int nworkers, int flags, Result* res) {
  memset(res, 0, sizeof *res);
  res->is_write = -1;
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  Launch L;
  L.entry = entry;
  L.bufs = bufs;
  L.res = res;
  L.flags = flags;
  L.total_groups = 1;
  for (int d = 0; d < 3; ++d) {
    L.grid[d] = grid[d];
    L.group[d] = group[d];
    if (group[d] == 0 || grid[d] == 0) return 0;
    L.ngroups[d] = (grid[d] + group[d] - 1) / group[d];
    L.total_groups *= L.ngroups[d];
  }
  if ((uint64_t)group[0] * group[1] * group[2] > kMaxGroup) {
    res->code = 3;
    snprintf(res->message, sizeof res->message, "threadgroup larger than %u threads", kMaxGroup);
    return res->code;
  }
  if (nworkers < 1) nworkers = 1;
  if (nworkers > kMaxWorkers) nworkers = kMaxWorkers;
  if ((uint64_t)nworkers > L.total_groups) nworkers = (int)L.total_groups;

  pthread_mutex_lock(&g_launch_mu);
  install_handlers();

  Worker ws[kMaxWorkers];
  pthread_t th[kMaxWorkers];
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 8 << 20);
  int started = 0;
  for (int i = 0; i < nworkers; ++i) {
    ws[i].slot = i;
    ws[i].launch = &L;
    if (pthread_create(&th[i], &attr, worker_main, &ws[i]) == 0) ++started;
    else break;
  }
  pthread_attr_destroy(&attr);
  if (started == 0) {
    res->code = 3;
    snprintf(res->message, sizeof res->message, "could not start a worker thread");
  }
  for (int i = 0; i < started; ++i) pthread_join(th[i], nullptr);
  g_tg_lo.store(UINTPTR_MAX);  // launches run one at a time (g_launch_mu)
  g_tg_hi.store(0);
  restore_handlers();
  pthread_mutex_unlock(&g_launch_mu);
  return res->code;
}

extern "C" unsigned mf_rt_result_size() { return (unsigned)sizeof(Result); }
