// CUDA on the CPU: just enough of the CUDA C++ device language to run the
// kernels of kernels_cu/ on a machine without a GPU, for tests (build.py
// compiles them with this header forced in; nothing in the package uses it).
//
// Each thread of a block is a fiber with its own stack; a block's fibers
// take turns on one OS thread, switching only at the synchronising
// intrinsics (__syncthreads, __syncwarp, the warp shuffles, votes and
// matches), so a block runs deterministically and every warp-level exchange
// sees exactly the lanes that reached it. Blocks run on a few OS threads at
// once (every block at once for a cooperative launch, whose grid barrier
// needs them all resident; in clusters, a block reads its cluster's blocks'
// dynamic shared memory through mapa / ld.shared::cluster, and a cluster
// barrier waits for every block of the cluster that has not ended).
// __shared__ variables are static thread_local: one copy per OS thread, and
// an OS thread runs one block at a time.
//
// What it checks beyond the results: a barrier that can never complete (a
// __syncthreads some threads skip, a warp op whose mask names a lane that
// left) is reported as a deadlock, and __trap() as an error, instead of
// hanging. What it does not model: timing, memory-ordering races between
// blocks (each block's view is sequentially consistent), the GPU's NaN
// payloads (x86 makes other NaNs; the hardware e4m3 cvt is emulated with
// the ops' one NaN code, which the GPU tests pin), and out-of-bounds
// accesses (the tests put canaries around the outputs).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
// build.py rewrites the static declarations (see poison_shared_once)
#define __shared__ static thread_local

struct uint3 { unsigned x, y, z; };
typedef uint3 dim3;
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

namespace emu {

// ---------------------------------------------------------------- fibers
struct Block;

struct Fiber {
    void* sp = nullptr;       // saved stack pointer while switched out
    unsigned char* stack = nullptr;
    uint3 thread_idx{};
    unsigned lane = 0, warp = 0;
    bool done = false;
    // bulk stores issued and not yet waited for (cp.async.bulk.wait_group.read):
    // the engine may read their shared-memory source any time until the wait
    struct BulkStore {
        void* dst;
        const void* src;
        unsigned bytes;
    };
    std::vector<BulkStore> bulk_stores;
};

struct WarpGroup {  // one warp-level exchange among the lanes of `mask`
    unsigned mask = 0, arrived = 0, left = 0, generation = 0;
    int state = 0;  // 0 free, 1 gathering the lanes' values, 2 lanes reading them
    unsigned long long slot[32];
};

struct Warp {
    WarpGroup groups[4];
    unsigned exited = 0;  // lanes that returned from the kernel
};

struct Block {
    uint3 block_idx{}, block_dim{}, grid_dim{};
    unsigned threads = 0, live = 0, arrived = 0, generation = 0;
    unsigned shared_bytes = 0;
    unsigned long long progress = 0;  // bumped whenever a fiber gets further
    Fiber* fibers = nullptr;
    Warp* warps = nullptr;
    void (*kernel)(void**) = nullptr;
    void** params = nullptr;
    const char* error = nullptr;
    char error_text[256];
    void* scheduler_sp = nullptr;
    unsigned cluster_arrived = 0, cluster_generation = 0;  // its threads at a cluster barrier
};

extern thread_local Block* current_block;
extern thread_local Fiber* current_fiber;
extern thread_local unsigned long long block_serial;
void yield_to_scheduler();
[[noreturn]] void fail(const char* format, ...);
unsigned char* dynamic_shared();
unsigned shared_offset(const void* p);
void* shared_pointer(unsigned offset);
unsigned* cooperative_workspace();

inline void note_progress() { ++current_block->progress; }

// A static __shared__ variable is a static thread_local (one copy per OS
// thread, which runs one block at a time). build.py puts a call of this after
// each declaration: the first of a block's threads to pass it fills the
// variable with garbage, as a new block finds shared memory on the GPU, so
// that reading it before writing it shows (`poisoned_for`: the block that
// last did, by block_serial).
inline void poison_shared_once(void* p, std::size_t bytes, unsigned long long& poisoned_for) {
    if (poisoned_for != block_serial) {
        std::memset(p, 0xA5, bytes);
        poisoned_for = block_serial;
    }
}

// ---------------------------------------------------------------- block barrier
inline void syncthreads() {
    Block* b = current_block;
    const unsigned generation = b->generation;
    if (++b->arrived == b->live) {
        b->arrived = 0;
        ++b->generation;
    }
    note_progress();
    while (b->generation == generation) yield_to_scheduler();
}

// ---------------------------------------------------------------- warp exchanges
inline WarpGroup& join_group(unsigned mask) {
    Fiber* f = current_fiber;
    Warp& w = current_block->warps[f->warp];
    if (!(mask >> f->lane & 1u)) fail("warp op: lane %u not in its own mask 0x%08x", f->lane, mask);
    if (mask & w.exited) fail("warp op: mask 0x%08x names lanes that exited (0x%08x)", mask, w.exited);
    WarpGroup* free_group = nullptr;
    for (WarpGroup& g : w.groups) {
        if (g.state == 1 && g.mask == mask) return g;
        if (g.state == 1 && (g.mask & mask))
            fail("warp op: overlapping masks 0x%08x and 0x%08x in one warp", g.mask, mask);
        if (g.state == 0 && !free_group) free_group = &g;
    }
    if (!free_group) fail("warp op: more than 4 exchanges pending in one warp");
    free_group->state = 1;
    free_group->mask = mask;
    free_group->arrived = free_group->left = 0;
    return *free_group;
}

// All lanes of `mask` deposit `value`; returns once all did. The slots stay
// readable until each lane has called release().
inline WarpGroup& rendezvous(unsigned mask, unsigned long long value) {
    Fiber* f = current_fiber;
    WarpGroup& g = join_group(mask);
    g.slot[f->lane] = value;
    g.arrived |= 1u << f->lane;
    note_progress();
    if (g.arrived == mask) {
        g.state = 2;
        ++g.generation;
        return g;
    }
    const unsigned generation = g.generation;
    while (g.generation == generation) yield_to_scheduler();
    return g;
}

// Second half of an exchange: the group is free again once every lane has
// read its result. No wait: a lane that runs on takes another group, and it
// cannot get more than one exchange ahead (the next one waits for all).
inline void release(WarpGroup& g, unsigned mask) {
    g.left |= 1u << current_fiber->lane;
    if (g.left == mask) g.state = 0;
}

template <typename T>
inline unsigned long long to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp exchange of more than 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <typename T>
inline T from_bits(unsigned long long bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

template <typename T>
inline T shuffle_from(unsigned mask, T v, unsigned source) {
    WarpGroup& g = rendezvous(mask, to_bits(v));
    const T result = (mask >> source & 1u) ? from_bits<T>(g.slot[source]) : v;
    release(g, mask);
    return result;
}

inline unsigned ballot(unsigned mask, bool predicate) {
    WarpGroup& g = rendezvous(mask, predicate ? 1 : 0);
    unsigned result = 0;
    for (unsigned lane = 0; lane < 32; ++lane)
        if ((mask >> lane & 1u) && g.slot[lane]) result |= 1u << lane;
    release(g, mask);
    return result;
}

template <typename T>
inline unsigned match_any(unsigned mask, T v) {
    WarpGroup& g = rendezvous(mask, to_bits(v));
    unsigned result = 0;
    for (unsigned lane = 0; lane < 32; ++lane)
        if ((mask >> lane & 1u) && g.slot[lane] == to_bits(v)) result |= 1u << lane;
    release(g, mask);
    return result;
}

inline void syncwarp(unsigned mask) {
    WarpGroup& g = rendezvous(mask, 0);
    release(g, mask);
}

}  // namespace emu

// ---------------------------------------------------------------- built-in variables
#define threadIdx (::emu::current_fiber->thread_idx)
#define blockIdx (::emu::current_block->block_idx)
#define blockDim (::emu::current_block->block_dim)
#define gridDim (::emu::current_block->grid_dim)

// ---------------------------------------------------------------- intrinsics
inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::syncwarp(mask); }
inline unsigned __ballot_sync(unsigned mask, int predicate) { return emu::ballot(mask, predicate != 0); }
inline int __any_sync(unsigned mask, int predicate) { return emu::ballot(mask, predicate != 0) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return emu::ballot(mask, predicate != 0) == mask; }
template <typename T>
inline unsigned __match_any_sync(unsigned mask, T v) { return emu::match_any(mask, v); }

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int source, int width = 32) {
    const unsigned lane = emu::current_fiber->lane;
    const unsigned base = lane & ~static_cast<unsigned>(width - 1);
    return emu::shuffle_from(mask, v, base + (static_cast<unsigned>(source) & (width - 1)));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const unsigned lane = emu::current_fiber->lane;
    const unsigned base = lane & ~static_cast<unsigned>(width - 1);
    unsigned source = lane ^ static_cast<unsigned>(lane_mask);
    if (source >= base + width) source = lane;
    return emu::shuffle_from(mask, v, source);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const unsigned lane = emu::current_fiber->lane;
    const unsigned base = lane & ~static_cast<unsigned>(width - 1);
    const unsigned source = lane >= base + delta ? lane - delta : lane;
    return emu::shuffle_from(mask, v, source);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const unsigned lane = emu::current_fiber->lane;
    const unsigned base = lane & ~static_cast<unsigned>(width - 1);
    const unsigned source = lane + delta < base + width ? lane + delta : lane;
    return emu::shuffle_from(mask, v, source);
}

[[noreturn]] inline void __trap() { emu::fail("__trap()"); }

template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }

template <typename T> inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <typename T> inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
template <typename T> inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <typename T> inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
template <typename T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline int __clz(int v) { return v ? __builtin_clz(static_cast<unsigned>(v)) : 32; }
inline unsigned __brev(unsigned v) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
    return r;
}

inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned v; std::memcpy(&v, &f, 4); return v; }
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }

// IEEE float32 with round to nearest even: the CPU's own (SSE, no
// contraction: build.py compiles with -ffp-contract=off; fmaf is exact).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }

// CUDA's fmaxf / fminf: a NaN operand, signaling ones included, gives the
// other (C's, IEEE maxNum, give NaN for a signaling one, as x86's 0x7FA20000).
inline float emu_fmaxf(float a, float b) {
    if (a != a) return b;
    if (b != b) return a;
    return a > b || (a == b && !std::signbit(a)) ? a : b;
}
inline float emu_fminf(float a, float b) {
    if (a != a) return b;
    if (b != b) return a;
    return a < b || (a == b && std::signbit(a)) ? a : b;
}
#define fmaxf emu_fmaxf
#define fminf emu_fminf

// CUDA's min/max overloads: the usual arithmetic conversions of the pair
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
    return a < b ? static_cast<std::common_type_t<A, B>>(a) : static_cast<std::common_type_t<A, B>>(b);
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
    return a > b ? static_cast<std::common_type_t<A, B>>(a) : static_cast<std::common_type_t<A, B>>(b);
}

inline unsigned long long __cvta_generic_to_shared(const void* p) { return emu::shared_offset(p); }

// ---------------------------------------------------------------- PTX the sources inline
// (build.py rewrites each asm statement into one of these)
namespace emu {

inline unsigned short cvt_e4m3_one(float v) {
    // cvt.rn.satfinite to e4m3fn: round to nearest even, clamp to +-448,
    // NaN to 0x7F (the GPU's canonical NaN is positive; x86's are not)
    unsigned bits = __float_as_uint(v);
    const unsigned sign = (bits >> 24) & 0x80u;
    unsigned magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return 0x7F;
    magnitude = std::min(magnitude, 0x43E00000u);
    unsigned code;
    if (magnitude >= 0x3C800000u) {
        code = ((magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20) - (120u << 3);
    } else {
        code = static_cast<unsigned>(std::nearbyint(static_cast<double>(__uint_as_float(magnitude)) * 512.0));
    }
    return static_cast<unsigned short>(sign | code);
}

// cvt.rn.satfinite.e4m3x2.f32 d, a, b: a's code in the upper byte
inline unsigned short cvt_e4m3x2(float a, float b) {
    return static_cast<unsigned short>((cvt_e4m3_one(a) << 8) | cvt_e4m3_one(b));
}

// cvt.f32.f16: exact (every half is a float). By hand, not _Float16, which
// C++ compilers before GCC 12 lack.
inline float cvt_f32_f16(unsigned short h) {
    const unsigned sign = static_cast<unsigned>(h >> 15) << 31;
    const unsigned exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact
        const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
        return __uint_as_float(__float_as_uint(magnitude) | sign);
    }
    if (exponent == 31) return __uint_as_float(sign | 0x7F800000u | (mantissa << 13));
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// cvt.rn.f16.f32: round to nearest even, subnormals kept, overflow to inf.
inline unsigned short cvt_rn_f16_f32(float f) {
    const unsigned bits = __float_as_uint(f);
    const unsigned sign = (bits >> 16) & 0x8000u;
    const unsigned magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return static_cast<unsigned short>(sign | 0x7E00u);
    if (magnitude >= 0x477FF000u)  // 65520 and up: past the largest half's midpoint
        return static_cast<unsigned short>(sign | 0x7C00u);
    if (magnitude >= 0x38800000u) {  // a normal half: 10 mantissa bits, nearest even
        const unsigned rounded = (magnitude + 0xFFFu + ((magnitude >> 13) & 1u)) >> 13;
        return static_cast<unsigned short>(sign | (rounded - (112u << 10)));
    }
    // a subnormal half (or zero): |f| * 2^24 is exact, rintf rounds to nearest even
    const float scaled = __uint_as_float(magnitude) * 0x1p24f;
    return static_cast<unsigned short>(sign | static_cast<unsigned>(std::rint(scaled)));
}

// cvt.rn.bf16x2.f32 d, a, b: a's bf16 in the upper half, b's in the lower;
// round to nearest even (carries into the exponent, up to inf), a NaN to the
// canonical 0x7FFF (the hardware's; the GPU tests' NaN cases check it).
inline unsigned short cvt_rn_bf16_one(float f) {
    if (f != f) return 0x7FFF;
    const unsigned u = __float_as_uint(f);
    return static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline unsigned cvt_rn_bf16x2_f32(float a, float b) {
    return static_cast<unsigned>(cvt_rn_bf16_one(a)) << 16 | cvt_rn_bf16_one(b);
}

// rcp.approx.ftz.f32: the correctly rounded reciprocal stands in for the
// approximation (the kernels refine it with a Newton step, which keeps an
// already correct result)
inline float rcp_approx_ftz(float d) {
    if (std::fpclassify(d) == FP_SUBNORMAL) d = std::copysign(0.0f, d);
    return 1.0f / d;
}

inline unsigned dynamic_smem_size() { return current_block->shared_bytes; }

// An mbarrier of one arrival a phase, as a shared 8-byte word: the phases
// completed so far (low half) and the transaction bytes still owed (high
// half, signed: a load may land before its arrival announces it). A phase
// completes when its arrival came and nothing is owed. A wait yields to the
// block's other threads until the phase it names completes, so a load issued
// late by another thread is waited for, and one never issued is reported as
// a deadlock; a wait on the wrong parity fails the same way (or passes at
// once where the GPU would too).
struct Mbarrier {
    unsigned completed;
    int owed : 31;
    unsigned arrived : 1;
};
static_assert(sizeof(Mbarrier) == 8, "an mbarrier is 8 bytes");

inline Mbarrier& mbarrier_at(unsigned barrier) {
    return *static_cast<Mbarrier*>(shared_pointer(barrier));
}

inline void mbarrier_settle(Mbarrier& m) {
    if (m.arrived && m.owed == 0) {
        ++m.completed;
        m.arrived = 0;
        note_progress();
    }
}

inline void mbarrier_init(unsigned barrier) { mbarrier_at(barrier) = Mbarrier{0, 0, 0}; }

inline void mbarrier_arrive_expect(unsigned barrier, unsigned bytes) {
    Mbarrier& m = mbarrier_at(barrier);
    if (m.arrived) fail("mbarrier: a second arrival in one phase (it expects one)");
    m.owed += static_cast<int>(bytes);
    m.arrived = 1;
    mbarrier_settle(m);
}

// try_wait.parity P: done once the phase of parity P has completed, that is
// while the current (pending) phase has the other parity
inline void mbarrier_wait(unsigned barrier, unsigned parity) {
    while ((mbarrier_at(barrier).completed & 1u) == (parity & 1u)) yield_to_scheduler();
}

inline void bulk_load(unsigned stage, const void* src, unsigned bytes, unsigned barrier) {
    std::memcpy(shared_pointer(stage), src, bytes);
    Mbarrier& m = mbarrier_at(barrier);
    m.owed -= static_cast<int>(bytes);
    mbarrier_settle(m);
}

// A bulk store reads its shared-memory source when the thread waits for it
// (the latest the engine may): a stage changed before the wait, or a thread
// that never waits (its block may retire, its shared memory be reused), is seen.
inline void bulk_store(void* dst, unsigned stage, unsigned bytes) {
    current_fiber->bulk_stores.push_back({dst, shared_pointer(stage), bytes});
}

inline void bulk_wait_read() {
    for (const Fiber::BulkStore& s : current_fiber->bulk_stores) std::memcpy(s.dst, s.src, s.bytes);
    current_fiber->bulk_stores.clear();
}

// the cooperative launch's workspace address, as %envreg1 (high) / %envreg2 (low)
inline unsigned envreg(int which) {
    const unsigned long long address = reinterpret_cast<unsigned long long>(cooperative_workspace());
    return which == 1 ? static_cast<unsigned>(address >> 32) : static_cast<unsigned>(address);
}

unsigned wait_while_equal(const unsigned* p, unsigned seen);
void wake_all(unsigned* p);
extern thread_local unsigned last_acquired;

// Thread block clusters, in a cooperative launch in clusters (runtime.inc):
// clusters of consecutive blocks along x; a block reads a peer's dynamic
// shared memory through an address mapa gives (its rank in the top byte).
unsigned cluster_rank();
unsigned cluster_size();
void cluster_sync();
unsigned map_to_cluster_block(unsigned local, unsigned rank);
int load_shared_cluster(unsigned address);

// The grid barrier's arrival and its spin on the word: the spin sleeps
// until the word differs from what this thread last read of it.
inline unsigned atom_add_release(unsigned* p, unsigned v) {
    const unsigned before = __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    // the waiters wait for the top bit to flip: only the last arrival wakes them
    if ((before ^ (before + v)) & 0x80000000u) wake_all(p);
    last_acquired = before;
    return before;
}

inline unsigned ld_acquire(const unsigned* p) {
    last_acquired = wait_while_equal(p, last_acquired);
    return last_acquired;
}

}  // namespace emu
