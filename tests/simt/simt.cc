// kvdrift: the SIMT simulator's runtime (see simt.h): fibers and their
// scheduler, device memory with its bounds, events, the conversions and the
// host matmul behind the cuBLASLt calls.
#include "simt.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fp8.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVD_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVD_SIMT_ASAN 1
#endif
#endif
#ifdef KVD_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KVD_SIMT_UNSANITIZED __attribute__((no_sanitize("address", "undefined")))
#else
#define KVD_SIMT_UNSANITIZED
#endif

// the fiber switch (x86-64: below; elsewhere ucontext) and a fiber's first frame
extern "C" void kvd_simt_swap(void **save_sp, void *to_sp);
extern "C" void kvd_simt_entry();

namespace kvd_simt {
void fiber_entry();

thread_ctx *self = nullptr;

// The order threads run in between two synchronisations: ascending (lane
// 0 first, warp 0 first, block (0,0,0) first), or, with KVD_SIMT_ORDER=
// reverse in the environment, descending. A kernel whose threads read what
// others write without a barrier or warp operation between them (a race on
// a GPU, where they run at once) sees those writes in one order and not in
// the other, so running the tests both ways shows the race.
const bool reverse_run = [] {
    const char *e = std::getenv("KVD_SIMT_ORDER");
    return e && !std::strcmp(e, "reverse");
}();

bool reverse_order() {
    return reverse_run;
}

// The device the simulator reports: an H200 (compute capability 9.0), or,
// with KVD_SIMT_DEVICE=sm_120 in the environment, a GeForce RTX 5090-class
// part (12.0: 170 multiprocessors, 99 KB of shared memory a block). The
// kernels choose their stages, splits and paths from these figures, so the
// parity tests run under each take the paths that device takes.
const simt_device &device() {
    static const simt_device d = [] {
        const char *e = std::getenv("KVD_SIMT_DEVICE");
        if (e && !std::strcmp(e, "sm_120"))
            return simt_device{"sm_120", 12, 0, 170, 99 * 1024, 100 * 1024};
        if (e && *e && std::strcmp(e, "sm_90")) {
            std::fprintf(stderr, "kvd_simt: KVD_SIMT_DEVICE=%s: expected sm_90 or sm_120\n", e);
            std::exit(2);
        }
        return simt_device{"sm_90", 9, 0, 132, 227 * 1024, 228 * 1024};
    }();
    return d;
}

namespace {

const int n_devices = 8; // tensor-parallel tests split over up to this many
int cur_device = 0;
std::map<std::pair<const void *, int>, size_t> shmem_optin;
cudaError_t last_error = cudaSuccess, sticky_error = cudaSuccess;

void fail(cudaError_t e) {
    if (last_error == cudaSuccess) last_error = e;
}

// ---- cudaMemcpyAsync from the host: a copy on the device's stream ----
// A GPU makes it at some time between the call and the stream's next
// operation. In ascending order (KVD_SIMT_ORDER) it lands at once; in
// reverse order it waits in its device's queue until just before that
// next operation (a launch, a copy, a memset, a cuBLASLt product, an
// all-reduce, a synchronisation, a free), and reads its source then. A
// host that rewrites the source before the copy is known to be done sends
// the new bytes in one order and the old in the other.
struct queued_copy {
    void *dst;
    const void *src;
    size_t n;
};
std::vector<queued_copy> queued[n_devices];

// ---- device memory: every allocation with its size and device ----
struct alloc {
    size_t n;
    int dev;
};
std::map<uintptr_t, alloc> allocs;

// the allocation holding [p, p + n), or end()
std::map<uintptr_t, alloc>::iterator find_alloc(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return allocs.end();
    --it;
    if (a < it->first || a + n > it->first + it->second.n) return allocs.end();
    return it;
}

bool range_ok(const void *p, size_t n, const char *what) {
    if (n == 0) return true;
    if (find_alloc(p, n) != allocs.end()) return true;
    auto it = find_alloc(p, 1);
    if (it == allocs.end())
        std::fprintf(stderr, "kvd_simt: %s: %p is not device memory\n", what, p);
    else
        std::fprintf(stderr,
                     "kvd_simt: %s: %zu bytes at offset %zu run past an allocation of %zu bytes\n",
                     what, n, (size_t)((uintptr_t)p - it->first), it->second.n);
    return false;
}

// ---- fibers ----
enum state { READY, AT_BARRIER, AT_WARP_OP, DONE };

#if defined(__x86_64__)
// the callee-saved registers on the stack of the fiber switched from, its
// stack pointer into *save_sp (the kernels leave MXCSR and the x87 control
// word alone, so they are not switched)
asm(R"(
    .pushsection .text
    .globl kvd_simt_swap
    .type kvd_simt_swap, @function
kvd_simt_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kvd_simt_swap, .-kvd_simt_swap
    .popsection
)");
#endif

struct fiber {
    thread_ctx ctx;
    int lane, warp;
    state st;
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
    void *fake_stack; // AddressSanitizer's, across switches
    warp_kind op;
    unsigned mask;
    uint64_t value, result;
    int arg, width;
    // cp.async copies not landed yet: destination, the source's bytes and
    // the group (commits before it); commits so far
    struct async_op {
        unsigned char *dst;
        unsigned char bytes[16];
        int size, group;
    };
    std::vector<async_op> async;
    int commits;
};

#ifdef KVD_SIMT_ASAN
const size_t stack_bytes = 256 << 10;
#else
const size_t stack_bytes = 64 << 10;
#endif
const size_t page = 4096;

std::vector<fiber> fibers;
unsigned gathered[32][32][8]; // warp_gather's tables, per warp of the block
std::vector<char *> stacks;   // one per thread slot, a guard page below each
#ifdef KVD_SIMT_ASAN
// per slot, how far below its top the stack may hold poisoned frames: all
// of it where the last thread there did not finish (a failed launch), else
// no deeper than its end (the whole stack's shadow at every thread's start
// was a 32 KB memset, most of the sanitizer build's simulated time)
std::vector<size_t> stack_dirty;
#endif
const std::function<void()> *body = nullptr;
const config *block_cfg = nullptr;
int block_n = 0, cur = -1;
bool block_failed = false;
#if defined(__x86_64__)
void *sched_sp = nullptr;
#else
ucontext_t sched_uc;
#endif
#ifdef KVD_SIMT_ASAN
void *sched_fake = nullptr;
void *sched_bottom = nullptr;
size_t sched_size = 0;
#endif
std::vector<unsigned char> dyn_smem;
std::vector<void *> fresh_shared; // the static __shared__ variables this block has filled

char *stack_of(int t) {
    while ((int)stacks.size() <= t) {
        void *m = mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            std::perror("kvd_simt: fiber stack");
            std::abort();
        }
        mprotect(m, page, PROT_NONE); // overflow faults instead of corrupting
        stacks.push_back(static_cast<char *>(m) + page);
    }
    return stacks[t];
}

// From fiber `from` to fiber `to`, or to the scheduler (to < 0); a finished
// fiber's stack is never resumed.
void switch_from(fiber &from, int to, bool finished) {
#ifdef KVD_SIMT_ASAN
    void **fake = finished ? nullptr : &from.fake_stack;
    if (to < 0)
        __sanitizer_start_switch_fiber(fake, sched_bottom, sched_size);
    else
        __sanitizer_start_switch_fiber(fake, stacks[to], stack_bytes);
#else
    (void)finished;
#endif
    if (to >= 0) cur = to, self = &fibers[to].ctx;
#if defined(__x86_64__)
    kvd_simt_swap(&from.sp, to < 0 ? sched_sp : fibers[to].sp);
#else
    swapcontext(&from.uc, to < 0 ? &sched_uc : &fibers[to].uc);
#endif
#ifdef KVD_SIMT_ASAN
    __sanitizer_finish_switch_fiber(from.fake_stack, nullptr, nullptr);
#endif
}

// from the scheduler into fiber t, until its warp can go no further
void to_fiber(int t) {
    cur = t;
    self = &fibers[t].ctx;
#ifdef KVD_SIMT_ASAN
    if (!sched_bottom) {
        pthread_attr_t at;
        pthread_getattr_np(pthread_self(), &at);
        pthread_attr_getstack(&at, &sched_bottom, &sched_size);
        pthread_attr_destroy(&at);
    }
    __sanitizer_start_switch_fiber(&sched_fake, stacks[t], stack_bytes);
#endif
#if defined(__x86_64__)
    kvd_simt_swap(&sched_sp, fibers[t].sp);
#else
    swapcontext(&sched_uc, &fibers[t].uc);
#endif
#ifdef KVD_SIMT_ASAN
    __sanitizer_finish_switch_fiber(sched_fake, nullptr, nullptr);
#endif
    self = nullptr;
}

int release_warp(const config &c, int w, int n);

// i-th of n in the run order
inline int nth(int i, int n) {
    return reverse_order() ? n - 1 - i : i;
}

// after the last lane of a warp has stopped (see yield_lane)
__attribute__((noinline)) void warp_stopped(fiber &f, bool finished);

// The running thread stops (at a barrier, a warp operation or its end):
// the next lane of its warp runs; after the warp's last lane, the warp's
// operations that can complete do, and its first released lane runs on (the
// warp stays together); else back to the scheduler. Lanes in run order.
// Every thread passes here at every warp operation, so the step to the next
// lane is kept short and inlined; the rest is warp_stopped's.
inline void yield_lane(fiber &f, bool finished) {
    const int base = f.warp * 32, lanes = std::min(32, block_n - base);
    const int at = reverse_order() ? lanes - 1 - f.lane : f.lane;
    for (int i = at + 1; i < lanes; i++)
        if (fibers[base + nth(i, lanes)].st == READY)
            return switch_from(f, base + nth(i, lanes), finished);
    warp_stopped(f, finished);
}

void warp_stopped(fiber &f, bool finished) {
    const int base = f.warp * 32, lanes = std::min(32, block_n - base);
    int r = release_warp(*block_cfg, f.warp, block_n);
    if (r < 0) block_failed = true;
    if (r > 0)
        for (int i = 0; i < lanes; i++) {
            const int l = nth(i, lanes);
            if (fibers[base + l].st == READY) {
                if (base + l == cur) return; // this very lane goes on
                return switch_from(f, base + l, finished);
            }
        }
    switch_from(f, -1, finished);
}

void fiber_main() {
#ifdef KVD_SIMT_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    (*body)();
#ifdef KVD_SIMT_ASAN
    // the kernel's frames have returned, and unpoisoned themselves: what may
    // be poisoned still is this frame and the few the last switch adds
    const size_t used = (size_t)(stacks[cur] + stack_bytes - (char *)__builtin_frame_address(0));
    stack_dirty[cur] = std::min(stack_bytes, used + (16u << 10));
#endif
    fibers[cur].st = DONE;
    yield_lane(fibers[cur], true);
    // A finished fiber is never resumed. The abort is behind a condition
    // the compiler cannot see through, so that it does not take this
    // function for one that never returns: under AddressSanitizer a call to
    // such a function first unpoisons the caller's whole stack (a memset of
    // its shadow and a system call), which was at every thread's start.
    static volatile bool never_resumed = true;
    if (never_resumed) std::abort();
}

void start_fiber(int t, char *stack) {
    fiber &f = fibers[t];
#ifdef KVD_SIMT_ASAN
    // frames of the last thread here: the whole stack unless it finished
    if ((int)stack_dirty.size() <= t) stack_dirty.resize(t + 1, stack_bytes);
    __asan_unpoison_memory_region(stack + stack_bytes - stack_dirty[t], stack_dirty[t]);
    stack_dirty[t] = stack_bytes;
#endif
#if defined(__x86_64__)
    // Every stack is a whole number of pages, so without an offset the
    // threads' top frames would all fall in the same sets of the L1 cache
    // and evict each other at every switch: each thread's stack starts a
    // different number of cache lines below its top.
    const size_t color = (size_t)(t % 64) * 64;
    uint64_t *s =
        reinterpret_cast<uint64_t *>(((uintptr_t)stack + stack_bytes - color) & ~(uintptr_t)15);
    *--s = 0;                                    // the entry's return address: never used
    *--s = (uint64_t)(uintptr_t)&kvd_simt_entry; // where kvd_simt_swap returns to
    for (int i = 0; i < 6; i++) *--s = 0;        // rbp, rbx, r12 .. r15
    f.sp = s;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = stack;
    f.uc.uc_stack.ss_size = stack_bytes;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_main, 0);
#endif
}

void describe(const config &c, const fiber &f, const char *what) {
    std::fprintf(stderr,
                 "kvd_simt: %s: block (%u,%u,%u) thread (%u,%u,%u) (warp %d, lane %d): %s\n",
                 c.name, f.ctx.bid.x, f.ctx.bid.y, f.ctx.bid.z, f.ctx.tid.x, f.ctx.tid.y,
                 f.ctx.tid.z, f.warp, f.lane, what);
}

const char *op_name(warp_kind k) {
    switch (k) {
    case W_SHFL_IDX:
        return "__shfl_sync";
    case W_SHFL_XOR:
        return "__shfl_xor_sync";
    case W_SHFL_DOWN:
        return "__shfl_down_sync";
    case W_BALLOT:
        return "__ballot_sync";
    case W_GATHER:
        return "warp_gather";
    case W_MMA:
        return "mma.sync";
    default:
        return "__activemask";
    }
}

// a lane's operands of mma.sync, as it passes them (mma_m16n8k16)
struct mma_operands {
    float *c;
    const unsigned *a, *b;
};

// One mma.sync of the warp whose 32 lanes F wait at it: C += A B, the 16 x 16
// A, 16 x 8 B and C gathered from the lanes' fragments (lane 4 g + t: a0 =
// A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 =
// A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c0, c1 =
// C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]), each element decoded once,
// every output's sum in mma_portable's order of k. False (the launch fails)
// where the lanes disagree on the input type. Without AddressSanitizer's
// checks: it reads the simulator's own state and the lanes' registers (on
// their fiber stacks), no memory of a kernel's, and the checks on its
// local tiles made it half the sanitized tensor-core kernels' time (and
// UBSan's: its indices are constants' and loops').
KVD_SIMT_UNSANITIZED bool mma_warp(const config &cfg, fiber *F) {
    const bool f16 = F[0].arg != 0;
    for (int l = 1; l < 32; l++)
        if ((F[l].arg != 0) != f16) {
            describe(cfg, F[l], "mma.sync with another input type than lane 0's");
            return false;
        }
    auto val = [f16](unsigned r, int hi) KVD_SIMT_UNSANITIZED {
        const unsigned bits = hi ? r >> 16 : r & 0xffffu;
        if (f16) {
            __half_raw h;
            h.x = (unsigned short)bits;
            return __half2float(__half(h));
        }
        const uint32_t u = bits << 16; // BF16: FP32's top half
        float x;
        std::memcpy(&x, &u, 4);
        return x;
    };
    // a row of B or C in one vector of 8 (GNU C++'s, the build's width): each
    // C[i][j] += A[i][k] B[k][j] rounded as the scalar loop rounds it (the
    // simulator is built without contraction), k in mma_portable's order
    typedef float row8 __attribute__((vector_size(32)));
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const mma_operands &o = *reinterpret_cast<const mma_operands *>(F[l].value);
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = val(o.a[0], e), A[g + 8][2 * t + e] = val(o.a[1], e);
            A[g][2 * t + 8 + e] = val(o.a[2], e), A[g + 8][2 * t + 8 + e] = val(o.a[3], e);
            B[2 * t + e][g] = val(o.b[0], e), B[2 * t + 8 + e][g] = val(o.b[1], e);
            C[g][2 * t + e] = o.c[e], C[g + 8][2 * t + e] = o.c[2 + e];
        }
    }
    row8 Bv[16];
    std::memcpy(Bv, B, sizeof Bv);
    static const int order[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};
    for (int i = 0; i < 16; i++) {
        row8 acc;
        std::memcpy(&acc, C[i], sizeof acc);
        for (int kk = 0; kk < 16; kk++) acc += A[i][order[kk]] * Bv[order[kk]];
        std::memcpy(C[i], &acc, sizeof acc);
    }
    for (int l = 0; l < 32; l++) {
        const mma_operands &o = *reinterpret_cast<const mma_operands *>(F[l].value);
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 2; e++) o.c[e] = C[g][2 * t + e], o.c[2 + e] = C[g + 8][2 * t + e];
    }
    return true;
}

// The warp operations of warp w that can complete: those whose every named
// lane has arrived at the same operation with the same mask. Returns how
// many threads it released; -1 on a lane of a mask that has exited.
int release_warp(const config &c, int w, int n) {
    const int base = w * 32, lanes = std::min(32, n - base);
    unsigned waiting = 0, live = 0;
    for (int l = 0; l < lanes; l++) {
        const fiber &f = fibers[base + l];
        if (f.st != DONE) live |= 1u << l;
        if (f.st == AT_WARP_OP) waiting |= 1u << l;
    }
    if (!waiting) return 0;
    fiber *F = &fibers[base];
    if (waiting == ~0u) { // the common case: the whole warp at one full-mask operation
        const warp_kind k = F[0].op;
        bool uniform = F[0].width == 32 && (k == W_ACTIVEMASK || F[0].mask == ~0u);
        for (int l = 1; l < 32 && uniform; l++)
            uniform = F[l].op == k && F[l].width == 32 && (k == W_ACTIVEMASK || F[l].mask == ~0u);
        if (uniform) {
            unsigned ballot = 0;
            if (k == W_BALLOT)
                for (int l = 0; l < 32; l++) ballot |= (F[l].value != 0) << l;
            if (k == W_MMA && !mma_warp(c, F)) return -1;
            for (int l = 0; l < 32; l++) {
                fiber &g = F[l];
                switch (k) {
                case W_SHFL_IDX:
                    g.result = F[g.arg & 31].value;
                    break;
                case W_SHFL_XOR:
                    g.result = (l ^ g.arg) < 32 ? F[l ^ g.arg].value : g.value;
                    break;
                case W_SHFL_DOWN:
                    g.result = l + g.arg < 32 ? F[l + g.arg].value : g.value;
                    break;
                case W_BALLOT:
                    g.result = ballot;
                    break;
                case W_ACTIVEMASK:
                    g.result = ~0u;
                    break;
                case W_MMA: // each lane's C, written by mma_warp
                    break;
                case W_GATHER:
                    std::memcpy(gathered[w][l], reinterpret_cast<const void *>(g.value),
                                sizeof(unsigned) * g.arg);
                    g.result = reinterpret_cast<uint64_t>(&gathered[w]);
                    break;
                }
                g.st = READY;
            }
            return 32;
        }
    }
    const unsigned exists = lanes == 32 ? ~0u : (1u << lanes) - 1;
    int released = 0;
    for (int l = 0; l < lanes; l++) {
        fiber &f = fibers[base + l];
        if (f.st != AT_WARP_OP) continue;
        unsigned m;
        if (f.op == W_GATHER || f.op == W_MMA) {
            describe(c, f,
                     f.op == W_GATHER ? "gathers without the whole warp at the gather"
                                      : "mma.sync without the whole warp at it");
            return -1;
        }
        if (f.op == W_ACTIVEMASK) {
            if (waiting != live) continue; // the warp has not converged yet
            m = live;
        } else {
            m = f.mask & exists;
            if (!(m & (1u << l))) {
                describe(c, f, "calls a warp operation with a mask that leaves out its own lane");
                return -1;
            }
            if (m & ~live) {
                describe(c, f, "names in its mask a lane that has exited");
                return -1;
            }
            if ((m & waiting) != m) continue;
        }
        bool same = true;
        for (int j = 0; j < lanes; j++)
            if (m & (1u << j)) {
                const fiber &g = fibers[base + j];
                if (g.op != f.op || (f.op != W_ACTIVEMASK && (g.mask & exists) != m)) same = false;
            }
        if (!same) {
            describe(c, f, "meets lanes of its mask at a different warp operation");
            return -1;
        }
        for (int j = 0; j < lanes; j++) {
            if (!(m & (1u << j))) continue;
            fiber &g = fibers[base + j];
            uint64_t r = g.value;
            int seg = j & ~(g.width - 1), src = j; // width is a power of two
            switch (g.op) {
            case W_SHFL_IDX:
                src = seg + (g.arg & (g.width - 1));
                break;
            case W_SHFL_XOR:
                src = j ^ g.arg;
                break;
            case W_SHFL_DOWN:
                src = j + g.arg;
                break;
            default:
                break;
            }
            if (g.op == W_SHFL_IDX || g.op == W_SHFL_XOR || g.op == W_SHFL_DOWN) {
                // outside the segment or the participants: the lane's own value
                if (src >= seg && src < seg + g.width && src < lanes && (m & (1u << src)))
                    r = fibers[base + src].value;
            } else if (g.op == W_BALLOT) {
                r = 0;
                for (int u = 0; u < lanes; u++)
                    if ((m & (1u << u)) && fibers[base + u].value) r |= 1u << u;
            } else {
                r = m;
            }
            g.result = r;
            released++;
        }
        for (int j = 0; j < lanes; j++)
            if (m & (1u << j)) fibers[base + j].st = READY;
    }
    return released;
}

// one block: -1 when a barrier or warp operation could not complete
int run_block(const config &c, uint3 bid) {
    const int n = (int)(c.block.x * c.block.y * c.block.z);
    // a block's shared memory holds nothing it did not write
    std::memset(dyn_smem.data(), 0xff, dyn_smem.size());
    fresh_shared.clear();
    for (int t = 0; t < n; t++) {
        fiber &f = fibers[t];
        f.ctx.tid = {t % c.block.x, t / c.block.x % c.block.y, t / (c.block.x * c.block.y)};
        f.ctx.bid = bid;
        f.ctx.bdim = c.block;
        f.ctx.gdim = c.grid;
        f.lane = t % 32, f.warp = t / 32;
        f.st = READY;
        f.fake_stack = nullptr;
        f.async.clear(), f.commits = 0;
        start_fiber(t, stacks[t]);
    }
    block_cfg = &c, block_n = n, block_failed = false;
    for (;;) {
        // each warp runs until it stops at a barrier, finishes or is stuck
        // (warps and their lanes in run order)
        const int warps = (n + 31) / 32;
        for (int i = 0; i < warps && !block_failed; i++) {
            const int w = nth(i, warps), lanes = std::min(32, n - w * 32);
            for (int j = 0; j < lanes; j++)
                if (fibers[w * 32 + nth(j, lanes)].st == READY) {
                    to_fiber(w * 32 + nth(j, lanes));
                    break;
                }
        }
        if (block_failed) return -1;
        int done = 0, at_barrier = 0;
        for (int t = 0; t < n; t++) {
            done += fibers[t].st == DONE;
            at_barrier += fibers[t].st == AT_BARRIER;
        }
        if (done == n) return 0;
        if (done + at_barrier == n) {
            for (int t = 0; t < n; t++)
                if (fibers[t].st == AT_BARRIER) fibers[t].st = READY;
            continue;
        }
        for (int t = 0; t < n; t++)
            if (fibers[t].st == AT_WARP_OP) {
                char what[128];
                std::snprintf(what, sizeof what, "waits at %s (mask 0x%08x) for lanes that %s",
                              op_name(fibers[t].op), fibers[t].mask,
                              at_barrier ? "wait at __syncthreads" : "never arrive");
                describe(c, fibers[t], what);
                break;
            }
        return -1;
    }
}

} // namespace

static unsigned long long launches = 0; // kernel launches asked for, kvd_simt_launches

// KVD_SIMT_PROFILE=1: the host time each kernel took to simulate, printed
// at exit, most first (where a test's minutes go on the simulator)
namespace {
struct kernel_time {
    double seconds = 0;
    unsigned long long launches = 0, threads = 0;
};
std::map<std::string, kernel_time> *profile_of() {
    static std::map<std::string, kernel_time> *m = [] {
        if (!std::getenv("KVD_SIMT_PROFILE")) return (std::map<std::string, kernel_time> *)nullptr;
        std::atexit([] {
            std::map<std::string, kernel_time> &all = *profile_of();
            std::vector<std::pair<std::string, kernel_time>> v(all.begin(), all.end());
            std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) {
                return a.second.seconds > b.second.seconds;
            });
            double total = 0;
            for (const auto &e : v) total += e.second.seconds;
            std::fprintf(stderr, "kvd_simt profile: %.1f s in kernels\n", total);
            std::fprintf(stderr, "%9s %6s %10s %14s  %s\n", "seconds", "share", "launches",
                         "threads", "kernel");
            for (const auto &e : v)
                std::fprintf(stderr, "%9.2f %5.1f%% %10llu %14llu  %s\n", e.second.seconds,
                             100 * e.second.seconds / (total > 0 ? total : 1), e.second.launches,
                             e.second.threads, e.first.c_str());
        });
        return new std::map<std::string, kernel_time>;
    }();
    return m;
}
} // namespace

void run(const config &c, const std::function<void()> &body_) {
    launches++;
    land_copies(cur_device);
    const unsigned long long threads = (unsigned long long)c.block.x * c.block.y * c.block.z;
    const char *bad = nullptr;
    if (!threads || threads > 1024 || c.block.z > 64)
        bad = "threads per block must be 1 to 1024 (z at most 64)";
    else if (!c.grid.x || !c.grid.y || !c.grid.z || c.grid.y > 65535 || c.grid.z > 65535)
        bad = "grid dimensions must be at least 1 (y and z at most 65535)";
    else if (c.shmem > 48 * 1024 && c.shmem > c.shmem_optin)
        bad = c.shmem_optin ? "more dynamic shared memory than the kernel's opt-in"
                            : "more than 48 KB of dynamic shared memory without an opt-in";
    cudaError_t code = cudaErrorInvalidConfiguration;
    char why[512];
    if (!bad) bad = refused_resources(c, why, sizeof why, &code);
    if (bad) {
        std::fprintf(stderr,
                     "kvd_simt: %s: launch of grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of "
                     "shared memory refused: %s\n",
                     c.name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, c.shmem,
                     bad);
        fail(code);
        return;
    }
    if (sticky_error != cudaSuccess) return; // a context after a fault runs nothing
    static const bool trace = std::getenv("KVD_SIMT_TRACE") != nullptr;
    if (trace)
        std::fprintf(stderr, "kvd_simt: %s grid (%u,%u,%u) block (%u,%u,%u) shared %zu\n", c.name,
                     c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, c.shmem);
    const int n = (int)threads;
    if ((int)fibers.size() < n) fibers.resize(n);
    for (int t = 0; t < n; t++) stack_of(t);
    dyn_smem.resize(c.shmem ? c.shmem : 1);
    body = &body_;
    struct timed { // KVD_SIMT_PROFILE's account of this launch, however it ends
        const config &c;
        unsigned long long threads;
        std::map<std::string, kernel_time> *prof = profile_of();
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        ~timed() {
            if (!prof) return;
            kernel_time &k = (*prof)[c.name];
            k.seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            k.launches++;
            k.threads += threads * c.grid.x * c.grid.y * c.grid.z;
        }
    } timing{c, threads};
    for (unsigned k = 0; k < c.grid.z; k++)
        for (unsigned j = 0; j < c.grid.y; j++)
            for (unsigned i = 0; i < c.grid.x; i++)
                if (run_block(c, {(unsigned)nth((int)i, (int)c.grid.x),
                                  (unsigned)nth((int)j, (int)c.grid.y),
                                  (unsigned)nth((int)k, (int)c.grid.z)})) {
                    sticky_error = cudaErrorLaunchFailure;
                    fail(sticky_error);
                    body = nullptr;
                    return;
                }
    body = nullptr;
}

void syncthreads() {
    fiber &f = fibers[cur];
    f.st = AT_BARRIER;
    yield_lane(f, false);
}

// a fault of the running thread: the launch fails, the first one named
static void thread_fault(const char *what) {
    if (!block_failed) describe(*block_cfg, fibers[cur], what);
    block_failed = true;
}

void need_aligned(const void *p, unsigned align, const char *what) {
    if ((uintptr_t)p % align == 0) return;
    char msg[160];
    std::snprintf(msg, sizeof msg, "%s at %p, not %u-byte aligned", what, p, align);
    thread_fault(msg);
}

void launch_bound(long long max_threads) {
    const dim3 &d = fibers[cur].ctx.bdim;
    const long long n = (long long)d.x * d.y * d.z;
    if (n <= max_threads) return;
    char msg[160];
    std::snprintf(msg, sizeof msg,
                  "a block of %lld threads, over the kernel's __launch_bounds__ (%lld)", n,
                  max_threads);
    thread_fault(msg);
}

void async_copy(void *dst, const void *src, int size, int src_bytes) {
    if (size != 4 && size != 8 && size != 16) thread_fault("cp.async of a size not 4, 8 or 16");
    need_aligned(dst, (unsigned)size, "cp.async's shared destination");
    need_aligned(src, (unsigned)size, "cp.async's global source");
    fiber &f = fibers[cur];
    fiber::async_op op;
    op.dst = static_cast<unsigned char *>(dst), op.size = size, op.group = f.commits;
    const unsigned char *s = static_cast<const unsigned char *>(src);
    for (int i = 0; i < size; i++) op.bytes[i] = i < src_bytes ? s[i] : 0;
    f.async.push_back(op);
}

void async_commit() {
    fibers[cur].commits++;
}

void async_wait(int n) {
    fiber &f = fibers[cur];
    size_t kept = 0;
    for (size_t i = 0; i < f.async.size(); i++) {
        if (f.async[i].group < f.commits - n)
            std::memcpy(f.async[i].dst, f.async[i].bytes, (size_t)f.async[i].size);
        else
            f.async[kept++] = f.async[i];
    }
    f.async.resize(kept);
}

const unsigned (*warp_gather(const unsigned *words, int n))[8] {
    if (n < 0 || n > 8) n = 8;
    return reinterpret_cast<const unsigned(*)[8]>(
        warp_op(W_GATHER, ~0u, reinterpret_cast<uint64_t>(words), n, 32));
}

void mma_m16n8k16(float c[4], const unsigned a[4], const unsigned b[2], bool f16) {
    const mma_operands o{c, a, b};
    warp_op(W_MMA, ~0u, reinterpret_cast<uint64_t>(&o), f16, 32);
}

uint64_t warp_op(warp_kind k, unsigned mask, uint64_t value, int arg, int width) {
    fiber &f = fibers[cur];
    if (width < 1 || width > 32 || (width & (width - 1))) width = 32;
    f.op = k, f.mask = mask, f.value = value, f.arg = arg, f.width = width;
    f.st = AT_WARP_OP;
    yield_lane(f, false);
    return f.result;
}

void fiber_entry() {
    fiber_main();
}

void *dynamic_shared() {
    return dyn_smem.data();
}

void land_copies(int dev) {
    for (int d = dev < 0 ? 0 : dev; d < (dev < 0 ? n_devices : dev + 1); d++) {
        for (const queued_copy &q : queued[d]) std::memmove(q.dst, q.src, q.n);
        queued[d].clear();
    }
}

void shared_fresh(void *p, size_t n) {
    for (void *q : fresh_shared)
        if (q == p) return;
    fresh_shared.push_back(p);
    std::memset(p, 0xff, n);
}

bool device_ptr(const void *p) {
    if (!p) return true;
    auto it = find_alloc(p, 1);
    return it != allocs.end() && it->second.dev == cur_device;
}

void bad_pointer(const config &c, int arg, const void *p) {
    auto it = find_alloc(p, 1);
    if (it == allocs.end())
        std::fprintf(stderr, "kvd_simt: %s: argument %d (%p) is not device memory\n", c.name,
                     arg + 1, p);
    else
        std::fprintf(stderr, "kvd_simt: %s: argument %d is memory of device %d, launched on %d\n",
                     c.name, arg + 1, it->second.dev, cur_device);
    sticky_error = cudaErrorIllegalAddress;
    fail(sticky_error);
}

cudaError_t func_set_shmem(const void *kernel, int bytes) {
    // the GPU takes what the kernel's static shared memory leaves
    const kernel_usage *u = usage_of(kernel);
    if (bytes < 0 || (size_t)bytes + (u ? u->smem : 0) > device().smem_optin) {
        fail(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    shmem_optin[{kernel, cur_device}] = (size_t)bytes;
    return cudaSuccess;
}

size_t func_shmem(const void *kernel) {
    auto it = shmem_optin.find({kernel, cur_device});
    return it == shmem_optin.end() ? 0 : it->second;
}

} // namespace kvd_simt

using namespace kvd_simt;

extern "C" void kvd_simt_entry() {
    kvd_simt::fiber_entry();
}

// ---- runtime API ----
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = nullptr;
    void *m = std::malloc(n ? n : 1);
    if (!m) return cudaErrorMemoryAllocation;
    std::memset(m, 0xff, n ? n : 1); // never-written memory reads as NaN / -1
    allocs[(uintptr_t)m] = {n ? n : 1, cur_device};
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    land_copies(cur_device); // it waits for the device
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) {
        std::fprintf(stderr, "kvd_simt: cudaFree(%p): not an allocation\n", p);
        fail(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}
// the current device's memory: the host's, less what its allocations hold
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    size_t used = 0;
    for (const auto &a : allocs)
        if (a.second.dev == cur_device) used += a.second.n;
    *total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGE_SIZE);
    *free_bytes = used < *total ? *total - used : 0;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    land_copies(cur_device);
    bool ok = true;
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
        ok = range_ok(dst, n, "cudaMemcpy destination");
    if (ok && (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice))
        ok = range_ok(src, n, "cudaMemcpy source");
    if (!ok) {
        fail(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    if (sticky_error != cudaSuccess) return sticky_error;
    if (n) std::memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) {
    *p = std::malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    land_copies(-1); // it waits for the device
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t) {
    if (kind != cudaMemcpyHostToDevice || !reverse_order()) return cudaMemcpy(dst, src, n, kind);
    if (!range_ok(dst, n, "cudaMemcpyAsync destination")) {
        fail(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    if (sticky_error != cudaSuccess) return sticky_error;
    if (n) queued[cur_device].push_back({dst, src, n});
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return cudaDeviceSynchronize();
}
cudaError_t cudaMemset(void *p, int value, size_t n) {
    land_copies(cur_device);
    if (!range_ok(p, n, "cudaMemset")) {
        fail(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    if (n) std::memset(p, value, n);
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    cudaError_t e = last_error;
    last_error = sticky_error;
    return e;
}
cudaError_t cudaDeviceSynchronize() {
    land_copies(cur_device);
    return sticky_error;
}
cudaError_t cudaDeviceReset() {
    queued[cur_device].clear();
    last_error = sticky_error = cudaSuccess;
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
        return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    }
    return "unknown error";
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = n_devices;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev < 0 || dev >= n_devices) return cudaErrorInvalidDevice;
    std::memset(p, 0, sizeof *p);
    const simt_device &d = device();
    std::snprintf(p->name, sizeof p->name, "kvdrift SIMT simulator"); // the caller adds sm_XY
    p->major = d.major, p->minor = d.minor, p->multiProcessorCount = d.sms, p->warpSize = 32;
    p->maxThreadsPerBlock = 1024, p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = d.smem_optin, p->sharedMemPerMultiprocessor = d.smem_sm;
    p->totalGlobalMem = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGE_SIZE);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *dev) {
    *dev = cur_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) {
    if (dev < 0 || dev >= n_devices) return cudaErrorInvalidDevice;
    cur_device = dev;
    return cudaSuccess;
}

// the events' clock: the host's, plus the time the simulated cuBLASLt
// algorithms are said to take (cublasLtMatmul below)
namespace {
double virtual_ms = 0;
}
struct kvd_simt_event {
    std::chrono::steady_clock::time_point t;
};
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new kvd_simt_event();
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    e->t = std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double, std::milli>(virtual_ms));
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
    land_copies(-1);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

// ---- conversions: the CPU codecs (held to CUDA's by tests/oracle) ----
float __bfloat162float(__nv_bfloat16 b) {
    return kvd_bf16_to_f32(b.__x);
}
__nv_bfloat16 __float2bfloat16_rn(float x) {
    return {kvd_f32_to_bf16(x)};
}
// FP8 values are exact in FP16: sign, exponent re-biased, mantissa widened
__half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t v, __nv_fp8_interpretation_t f) {
    if (f == __NV_E5M2) return {(unsigned short)(v << 8)}; // E5M2 is FP16's top byte
    unsigned s = (v & 0x80u) << 8, e = (v >> 3) & 15u, m = v & 7u;
    if (e == 15 && m == 7) return {(unsigned short)(s | 0x7fffu)}; // NaN
    if (e == 0) {
        if (m == 0) return {(unsigned short)s};
        // subnormal m * 2^-9: normalise into FP16 (bias 15)
        int ee = -6;
        while (!(m & 8u)) m <<= 1, ee--;
        return {(unsigned short)(s | (unsigned)(ee + 15) << 10 | (m & 7u) << 7)};
    }
    return {(unsigned short)(s | (e - 7 + 15) << 10 | m << 7)};
}
__half __float2half_rn(float x) {
    _Float16 h = (_Float16)x; // IEEE binary16, round to nearest even
    __half r;
    std::memcpy(&r.__x, &h, 2);
    return r;
}
float kvd_simt::half_rare(__half h) {
    const unsigned s = (h.__x & 0x8000u) << 16, m = h.__x & 1023u;
    if ((h.__x & 0x7c00u) == 0) { // zero or subnormal: m * 2^-24
        float f = std::ldexp((float)m, -24);
        return s ? -f : f;
    }
    const uint32_t u = s | 0x7f800000u | m << 13; // infinity or NaN
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
__nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t s,
                                         __nv_fp8_interpretation_t f) {
    return f == __NV_E5M2 ? kvd_f32_to_e5m2(x, s == __NV_SATFINITE)
                          : kvd_f32_to_e4m3(x, s == __NV_SATFINITE);
}

// ---- cuBLASLt on the host ----
struct kvd_simt_lt {
    int live;
};
struct kvd_simt_lt_desc {
    cublasOperation_t ta, tb;
};
struct kvd_simt_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct kvd_simt_lt_pref {
    size_t workspace;
};

// the simulator's cuBLASLt is always there (lt_open.c's twin)
extern "C" const char *kvd_cublaslt_missing(void) {
    return nullptr;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new kvd_simt_lt{1};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new kvd_simt_lt_desc{CUBLAS_OP_N, CUBLAS_OP_N};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *v,
                                              size_t n) {
    if (n != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(a == CUBLASLT_MATMUL_DESC_TRANSA ? &d->ta : &d->tb, v, n);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new kvd_simt_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new kvd_simt_lt_pref{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void *v, size_t n) {
    if (n != sizeof(size_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&p->workspace, v, n);
    return CUBLAS_STATUS_SUCCESS;
}

namespace {
// op(X) as a rows x cols column-major matrix: its (i, j) element
float lt_at(const void *p, const kvd_simt_lt_layout *l, cublasOperation_t op, uint64_t i,
            uint64_t j) {
    uint64_t r = op == CUBLAS_OP_N ? i : j, c = op == CUBLAS_OP_N ? j : i;
    size_t idx = (size_t)(c * (uint64_t)l->ld + r);
    if (l->type == CUDA_R_16BF) return kvd_bf16_to_f32(static_cast<const uint16_t *>(p)[idx]);
    return static_cast<const float *>(p)[idx];
}
size_t lt_bytes(const kvd_simt_lt_layout *l) {
    size_t e = l->type == CUDA_R_16BF ? 2 : 4;
    return l->cols ? ((size_t)(l->cols - 1) * (size_t)l->ld + l->rows) * e : 0;
}
uint64_t op_rows(const kvd_simt_lt_layout *l, cublasOperation_t op) {
    return op == CUBLAS_OP_N ? l->rows : l->cols;
}
uint64_t op_cols(const kvd_simt_lt_layout *l, cublasOperation_t op) {
    return op == CUBLAS_OP_N ? l->cols : l->rows;
}
bool lt_shapes(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
               cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl) {
    return op_cols(a, d->ta) == op_rows(b, d->tb) && op_rows(a, d->ta) == c->rows &&
           op_cols(b, d->tb) == c->cols && c->rows == dl->rows && c->cols == dl->cols &&
           dl->type == CUDA_R_32F;
}
} // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t, int want,
                                              cublasLtMatmulHeuristicResult_t *out, int *found) {
    *found = 0;
    if (!h || !lt_shapes(d, a, b, c, dl)) return CUBLAS_STATUS_INVALID_VALUE;
    // the simulator's "algorithms" (ids 1-3) compute alike and differ in
    // the time the events see (cublasLtMatmul): the heuristic's first is
    // not the fastest, as on a GPU it sometimes is not
    for (int i = 0; i < want && i < 3; i++) {
        std::memset(&out[i], 0, sizeof out[i]);
        out[i].algo.data[0] = (uint64_t)i + 1;
        out[i].state = CUBLAS_STATUS_SUCCESS;
        ++*found;
    }
    return CUBLAS_STATUS_SUCCESS;
}

namespace {
// products run by algorithm id (1-3), and the milliseconds each is said to
// take: id 2 well ahead of id 1, the heuristic's first; id 3 ahead of id 2
// by less than the 5% tuning asks before it leaves the heuristic's order.
// The events add these to the host's clock, whose time for the product
// itself (a tenth of a second or more under the sanitizers, more on a busy
// machine) must not decide between ids 2 and 3: the gap that keeps id 2 is
// 1000 ms, minutes of virtual time a tuning, none of it waited for.
unsigned long long lt_calls[4];
const double lt_virtual_ms[4] = {0, 100000, 60000, 58000};
} // namespace

extern "C" unsigned long long kvd_simt_lt_calls(int id) {
    return id >= 1 && id <= 3 ? lt_calls[id] : 0;
}

// The simulated cuBLASLt's sums: acc[j][i] = sum over k, ascending, of
// op(A)[i][k] op(B)[k][j], from at (tiles of LT_ROWS rows, a k's rows side by
// side, so a tile's LT_ROWS sums run as one vector of independent sums, each
// in its own order) and bc (column j's run over k). Outside the sanitizers'
// checks: it reads the simulator's own copies, made by checked loads.
static constexpr uint64_t LT_ROWS = 8;
KVD_SIMT_UNSANITIZED static void lt_sums(const float *at, const float *bc, float *acc,
                                         uint64_t tiles, uint64_t N, uint64_t K) {
    for (uint64_t j = 0; j < N; j++) {
        const float *bj = bc + j * K;
        for (uint64_t tl = 0; tl < tiles; tl++) {
            const float *t0 = at + tl * K * LT_ROWS;
            float s[LT_ROWS] = {0};
            for (uint64_t k = 0; k < K; k++)
                for (uint64_t t = 0; t < LT_ROWS; t++) s[t] += t0[k * LT_ROWS + t] * bj[k];
            for (uint64_t t = 0; t < LT_ROWS; t++)
                acc[j * tiles * LT_ROWS + tl * LT_ROWS + t] = s[t];
        }
    }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B,
                              cublasLtMatrixLayout_t b, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t) {
    land_copies(cur_device);
    if (!h || !algo || algo->data[0] < 1 || algo->data[0] > 3 || !lt_shapes(d, a, b, c, dl))
        return CUBLAS_STATUS_INVALID_VALUE;
    lt_calls[algo->data[0]]++;
    virtual_ms += lt_virtual_ms[algo->data[0]];
    if (!range_ok(A, lt_bytes(a), "cublasLtMatmul A") ||
        !range_ok(B, lt_bytes(b), "cublasLtMatmul B") ||
        !range_ok(D, lt_bytes(dl), "cublasLtMatmul D"))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    const uint64_t M = dl->rows, N = dl->cols, K = op_cols(a, d->ta);
    // op(A) in tiles of LT_ROWS rows, each k's rows side by side (a tile
    // past M padded with zeros), and op(B)'s columns as FP32 runs over k,
    // read once; then every sum over k in ascending order
    const uint64_t tiles = (M + LT_ROWS - 1) / LT_ROWS;
    std::vector<float> at((size_t)(tiles * K * LT_ROWS), 0.0f), bc((size_t)(N * K));
    for (uint64_t i = 0; i < M; i++)
        for (uint64_t k = 0; k < K; k++)
            at[(size_t)(((i / LT_ROWS) * K + k) * LT_ROWS + i % LT_ROWS)] =
                lt_at(A, a, d->ta, i, k);
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t k = 0; k < K; k++) bc[(size_t)(j * K + k)] = lt_at(B, b, d->tb, k, j);
    std::vector<float> acc((size_t)(tiles * LT_ROWS * N));
    lt_sums(at.data(), bc.data(), acc.data(), tiles, N, K);
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            float &r = acc[(size_t)(j * tiles * LT_ROWS + i)];
            r = al * r;
            if (be != 0.0f) r += be * lt_at(C, c, CUBLAS_OP_N, i, j);
        }
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++)
            static_cast<float *>(D)[(size_t)(j * (uint64_t)dl->ld + i)] =
                acc[(size_t)(j * tiles * LT_ROWS + i)];
    return CUBLAS_STATUS_SUCCESS;
}

// the kernel launches the process has asked for (tests count a step's)
extern "C" unsigned long long kvd_simt_launches(void) {
    return kvd_simt::launches;
}
