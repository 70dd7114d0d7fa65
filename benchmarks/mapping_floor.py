"""The floor under issue 12's prefill target: what the dependency chain of any
one-pass, deterministic routing plan costs on this GPU before it does any of
a plan's real work. GPU only.

    python benchmarks/mapping_floor.py [--json PATH] [--tree-only]

Every slot's row depends on every expert's total, which depends on every
slot: a plan must load all ids, count them, make the counts visible
grid-wide (a grid barrier, or a second kernel), read counts back, and only
then store its rows. These skeleton kernels do exactly that chain and
nothing more, on the manifest's fused_mapping prefill shapes (int64 ids), per
call in a CUDA graph of 100 calls (the issue's figure, timed as
bench_fused_mapping.py times ``fused_mapping``):

  empty        a launch that does nothing (the graph's per-node floor)
  coop-empty   the same, launched cooperative on the plan's grid
  barrier      one grid barrier (kernels_cu/grid_barrier.cuh), nothing else
  stream       ids loaded, token_topk_to_pos and the three pos rows stored,
               no dependency between them (launch + bandwidth)
  chain        stream's loads and stores with the plan's dependency between
               them: shared-memory counts, the block's counts row stored, a
               grid barrier, ONE row of counts read back (a real plan sums
               every block's row) and used in every store
  two-kernel   the chain as two plain launches (counts, then stores): the
               barrier replaced by a kernel boundary
  chain + sums the chain, but every block reads every block's counts row
               after the barrier (its prefix and the totals), as
               fused_mapping's cooperative kernel does: B x B x E reads
               (here int32 loads, 4 in flight a thread: slower than the
               kernel's 16-byte loads of 8 uint16 counts; measured slower
               than fused_mapping itself, so it shows only these loads)
  chain + scan the chain with a second barrier instead: block b scans the
               columns of experts b, b + B, ... over the B blocks, writes
               every block's prefix of them, and after the second barrier
               each block reads its prefix row and the totals (B x E reads)
  chain + tree the chain with a Fenwick tree of block counts instead: each
               block adds its counts to at most log2(B) + 1 tree rows by
               global atomics before the barrier, and reads popcount(b) + 1
               rows after it (its prefix, the totals); the tree kept zero
               between calls by two buffers and a parity word (checked
               against chain + sums before timing)
  + memset     chain + tree with one tree zeroed by a memset node before
               every call instead (the tree in per-call scratch)
  + PDL zero   ... zeroed by a small kernel launched just before, which the
               cooperative kernel may overlap (programmatic dependent
               launch): it waits for it before its atomics
  v4           the tree's nodes float32 (exact for counts < 2^24), 4
               experts an atomic (red.global.add.v4.f32, sm_90+)
  wide         the chain, chain + scan and the trees on 128 blocks (the
               default plan takes 64 for E >= 256: its B x B x E reads)

``--tree-only``: the chain, the tree columns and fused_mapping alone.

The real plan (``fused_mapping``, default launch shape) is timed in the same
run. The skeletons' stores are dummies, not a plan; their outputs are never
read. The grid is the default plan's (blocks x 256 threads).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

import cupy
import numpy as np
import torch
from cupy.cuda import driver

import cupy_moe
from cupy_moe.harness.manifest import load_workloads
from cupy_moe.harness.timing import torch_graph_us
from cupy_moe.mapping import worst_case_rows
from cupy_moe.mapping.gpu import plan_for
from cupy_moe.mapping.rules import MappingProblem
from cupy_moe.runtime.loader import kernel_dir

THREADS = 256
WIDE_BLOCKS = 128  # the "wide" columns' grid (or the SM count, if fewer)
COLUMNS = 8  # experts a block scans in floor_chain_scan (COLS in the source)
IDS_A_THREAD = 8  # loads in flight a thread (the shapes below need at most 2-4)

SOURCE = r"""
#include "grid_barrier.cuh"

struct FloorArgs {
    const long long* ids;   // [N]
    int* counts;            // [blocks, E]
    int* token_pos;         // [N]
    int* pos_rows;          // [3, X]
    int* tree;              // floor_chain_tree: [2, B, E] + [1], zeroed once
    int n, experts, x, pad;
};

extern "C" __global__ void floor_empty(const FloorArgs a) {}

extern "C" __global__ void floor_barrier(const FloorArgs a) { grid_barrier(); }

// The block's slots [first, end): blocks take equal consecutive shares.
__device__ __forceinline__ void block_slots(const FloorArgs& a, int& first, int& end) {
    const int share = (a.n + gridDim.x - 1) / gridDim.x;
    first = blockIdx.x * share;
    end = min(a.n, first + share);
}

// This thread's ids (every load issued before any is used), -1 past the end.
__device__ __forceinline__ void load_ids(const FloorArgs& a, int first, int end,
                                         long long (&id)[IDS]) {
#pragma unroll
    for (int u = 0; u < IDS; ++u) {
        const int slot = first + threadIdx.x + u * blockDim.x;
        id[u] = slot < end ? a.ids[slot] : -1;
    }
}

// Every row of the three pos rows stored once, grid-stride.
__device__ __forceinline__ void store_pos_rows(const FloorArgs& a, int value) {
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < a.x; p += gridDim.x * blockDim.x) {
        a.pos_rows[p] = value;
        a.pos_rows[a.x + p] = value;
        a.pos_rows[2 * a.x + p] = value;
    }
}

extern "C" __global__ void floor_stream(const FloorArgs a) {
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    load_ids(a, first, end, id);
#pragma unroll
    for (int u = 0; u < IDS; ++u) {
        const int slot = first + threadIdx.x + u * blockDim.x;
        if (slot < end) a.token_pos[slot] = static_cast<int>(id[u]);
    }
    store_pos_rows(a, -1);
}

// Count phase: ids loaded, counted in shared memory, the block's row stored
// (unless store_row is false).
__device__ __forceinline__ void count_phase(const FloorArgs& a, int* hist, int first, int end,
                                            long long (&id)[IDS], bool store_row = true) {
    for (int j = threadIdx.x; j < a.experts; j += blockDim.x) hist[j] = 0;
    load_ids(a, first, end, id);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < IDS; ++u)
        if (id[u] >= 0 && id[u] < a.experts) atomicAdd(&hist[id[u]], 1);
    __syncthreads();
    if (!store_row) return;
    for (int j = threadIdx.x; j < a.experts; j += blockDim.x)
        a.counts[blockIdx.x * a.experts + j] = hist[j];
}

// Store phase: every store depends on base[e] (shared memory, filled by
// one of the variants below after the counts are visible).
__device__ __forceinline__ void store_with(const FloorArgs& a, const int* base, int first,
                                          int end, const long long (&id)[IDS]) {
#pragma unroll
    for (int u = 0; u < IDS; ++u) {
        const int slot = first + threadIdx.x + u * blockDim.x;
        if (slot < end)
            a.token_pos[slot] = id[u] >= 0 && id[u] < a.experts ? base[id[u]] + slot : -1;
    }
    store_pos_rows(a, base[0]);
}

// ONE block row of counts read back (the next block's): the least any plan
// reads after its counts are visible.
__device__ __forceinline__ void store_phase(const FloorArgs& a, int* hist, int first, int end,
                                            const long long (&id)[IDS]) {
    const int* row = a.counts + ((blockIdx.x + 1) % gridDim.x) * a.experts;
    for (int j = threadIdx.x; j < a.experts; j += blockDim.x) hist[j] = row[j];
    __syncthreads();
    store_with(a, hist, first, end, id);
}

extern "C" __global__ void floor_chain(const FloorArgs a) {
    extern __shared__ int hist[];
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    count_phase(a, hist, first, end, id);
    grid_barrier();
    store_phase(a, hist, first, end, id);
}

extern "C" __global__ void floor_count(const FloorArgs a) {
    extern __shared__ int hist[];
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    count_phase(a, hist, first, end, id);
}

extern "C" __global__ void floor_store(const FloorArgs a) {
    extern __shared__ int hist[];
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    load_ids(a, first, end, id);
    store_phase(a, hist, first, end, id);
}

// What fused_mapping does after its barrier: every block sums every block's
// row (B x E counts; all blocks read the same lines), its own prefix (rows
// before it) and the totals, 4 loads in flight a thread.
extern "C" __global__ void floor_chain_sums(const FloorArgs a) {
    extern __shared__ int hist[];  // [E] counts, then [E] prefix + totals
    int* base = hist + a.experts;
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    count_phase(a, hist, first, end, id);
    grid_barrier();
    for (int j = threadIdx.x; j < a.experts; j += blockDim.x) {
        int earlier = 0, total = 0;
        for (int b0 = 0; b0 < gridDim.x; b0 += 4) {
            int c[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                c[u] = b0 + u < gridDim.x ? a.counts[(b0 + u) * a.experts + j] : 0;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                total += c[u];
                earlier += b0 + u < blockIdx.x ? c[u] : 0;
            }
        }
        base[j] = earlier + total;
    }
    __syncthreads();
    store_with(a, base, first, end, id);
}

// The alternative: a second barrier instead of B x B x E reads. After the
// first, block b takes columns b, b + B, ... (at most COLS), thread t < B
// reads block t's count, and a block scan gives every block's prefix of that
// expert (written to prefix [B, E]) and its total; after the second, a block
// reads its own prefix row and the totals: O(B x E) reads in all.
extern "C" __global__ void floor_chain_scan(const FloorArgs a) {
    extern __shared__ int hist[];  // [E] counts, then [E] prefix + totals
    int* base = hist + a.experts;
    __shared__ int warp_sums[COLS][32];
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    count_phase(a, hist, first, end, id);
    grid_barrier();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int v[COLS], incl[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {  // every column's load first
        const int j = blockIdx.x + c * gridDim.x;
        v[c] = j < a.experts && threadIdx.x < gridDim.x ? a.counts[threadIdx.x * a.experts + j]
                                                         : 0;
    }
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
        incl[c] = v[c];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int other = __shfl_up_sync(0xffffffffu, incl[c], d);
            if (lane >= d) incl[c] += other;
        }
        if (lane == 31) warp_sums[c][warp] = incl[c];
    }
    __syncthreads();
    int* prefix = a.counts + gridDim.x * a.experts;  // [B, E], then totals [E]
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
        const int j = blockIdx.x + c * gridDim.x;
        int before = 0, total = 0;
        for (int w = 0; w < (blockDim.x >> 5); ++w) {
            before += w < warp ? warp_sums[c][w] : 0;
            total += warp_sums[c][w];
        }
        if (j < a.experts && threadIdx.x < gridDim.x)
            prefix[threadIdx.x * a.experts + j] = before + incl[c] - v[c];
        if (j < a.experts && threadIdx.x == 0) prefix[gridDim.x * a.experts + j] = total;
    }
    grid_barrier();
    const int* mine = prefix + blockIdx.x * a.experts;
    const int* totals = prefix + gridDim.x * a.experts;
    for (int j = threadIdx.x; j < a.experts; j += blockDim.x) base[j] = mine[j] + totals[j];
    __syncthreads();
    store_with(a, base, first, end, id);
}

// A third way to read fewer counts after the one barrier: a Fenwick tree
// of block counts built by global atomics before it. Block b adds its
// counts to nodes b + 1, then i += lowbit(i) (at most log2(B) + 1 rows);
// after the barrier its prefix is the sum of nodes b, then i -= lowbit(i)
// (popcount(b) rows) and the totals that of nodes B, ... (one row when B is
// a power of two). Integer sums do not depend on the atomics' order, so the
// result is deterministic. The tree must start at zero. a.pad's bits say
// how, and how the atomics add:
//   0            two buffers, a parity word picks this call's; every block
//                zeroes its share of the other one for the next call
//                (stream order), block 0 flips the parity after the barrier
//                (every block read it before arriving)
//   TREE_ZEROED  the caller zeroed tree 0 before the launch (a memset node)
//   TREE_PDL     ... by floor_zero_tree, launched just before: this kernel
//                may start while it runs (programmatic dependent launch)
//                and waits for it before its atomics
//   TREE_V4      the nodes float32 (counts < 2^24: exact, so still
//                order-independent), 4 experts an atomic (red.v4.f32)
#define TREE_DEPTH 9  // nodes a query visits, at most (B <= 256)
#define TREE_ZEROED 1
#define TREE_PDL 2
#define TREE_V4 4

extern "C" __global__ void floor_zero_tree(const FloorArgs a) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int words = a.x;  // (the launcher passes the tree's words as x)
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < words; k += gridDim.x * blockDim.x)
        a.tree[k] = 0;
}

__device__ __forceinline__ float4 operator+(float4 x, float4 y) {
    return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}
__device__ __forceinline__ float4& operator+=(float4& x, float4 y) { return x = x + y; }

// The tree's nodes summed for expert j: every load before any sum.
template <typename T>
__device__ __forceinline__ T tree_sums(const T* tree, int experts, int j, int nodes) {
    T earlier[TREE_DEPTH], total[TREE_DEPTH];
    int i = blockIdx.x, k = nodes;
#pragma unroll
    for (int d = 0; d < TREE_DEPTH; ++d) {
        earlier[d] = i > 0 ? __ldcg(tree + (i - 1) * experts + j) : T{};
        total[d] = k > 0 ? __ldcg(tree + (k - 1) * experts + j) : T{};
        i -= i & -i;
        k -= k & -k;
    }
    T sum{};
#pragma unroll
    for (int d = 0; d < TREE_DEPTH; ++d) sum += earlier[d] + total[d];
    return sum;
}

extern "C" __global__ void floor_chain_tree(const FloorArgs a) {
    extern __shared__ int hist[];  // [E] counts, then [E] prefix + totals
    int* base = hist + a.experts;
    const int nodes = gridDim.x, experts = a.experts;
    const bool parity_buffers = (a.pad & (TREE_ZEROED | TREE_PDL)) == 0;
    int* parity_word = a.tree + 2 * nodes * experts;
    const int parity = parity_buffers ? *parity_word : 0;
    int* tree = a.tree + parity * nodes * experts;
    int* other = a.tree + (1 - parity) * nodes * experts;
    int first, end;
    block_slots(a, first, end);
    long long id[IDS];
    count_phase(a, hist, first, end, id, /*store_row=*/false);
    if (a.pad & TREE_PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (a.pad & TREE_V4) {
        float* ftree = reinterpret_cast<float*>(tree);
        for (int i = blockIdx.x + 1; i <= nodes; i += i & -i)
            for (int q = threadIdx.x; q < experts / 4; q += blockDim.x) {
                const int4 c = reinterpret_cast<const int4*>(hist)[q];
                if (c.x | c.y | c.z | c.w)
                    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                                 :: "l"(ftree + (i - 1) * experts + 4 * q), "f"(float(c.x)),
                                    "f"(float(c.y)), "f"(float(c.z)), "f"(float(c.w))
                                 : "memory");
            }
    } else {
        for (int i = blockIdx.x + 1; i <= nodes; i += i & -i)
            for (int j = threadIdx.x; j < experts; j += blockDim.x)
                if (hist[j]) atomicAdd(&tree[(i - 1) * experts + j], hist[j]);
    }
    grid_barrier();
    if (a.pad & TREE_V4) {
        const float4* ftree = reinterpret_cast<const float4*>(tree);
        for (int q = threadIdx.x; q < experts / 4; q += blockDim.x) {
            const float4 sum = tree_sums(ftree, experts / 4, q, nodes);
            base[4 * q] = static_cast<int>(sum.x);
            base[4 * q + 1] = static_cast<int>(sum.y);
            base[4 * q + 2] = static_cast<int>(sum.z);
            base[4 * q + 3] = static_cast<int>(sum.w);
        }
    } else {
        for (int j = threadIdx.x; j < experts; j += blockDim.x)
            base[j] = tree_sums(tree, experts, j, nodes);
    }
    __syncthreads();
    store_with(a, base, first, end, id);
    if (!parity_buffers) return;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < nodes * experts;
         k += gridDim.x * blockDim.x)
        other[k] = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) *parity_word = 1 - parity;
}
"""

KERNELS = ("floor_empty", "floor_barrier", "floor_stream", "floor_chain", "floor_count",
           "floor_store", "floor_chain_sums", "floor_chain_scan", "floor_chain_tree",
           "floor_zero_tree")


class FloorArgs(ctypes.Structure):
    _fields_ = [("ids", ctypes.c_void_p), ("counts", ctypes.c_void_p),
                ("token_pos", ctypes.c_void_p), ("pos_rows", ctypes.c_void_p),
                ("tree", ctypes.c_void_p), ("n", ctypes.c_int), ("experts", ctypes.c_int),
                ("x", ctypes.c_int), ("pad", ctypes.c_int)]


# floor_chain_tree's flags (a.pad; TREE_* in the source)
TREE_ZEROED, TREE_PDL, TREE_V4 = 1, 2, 4
TREE_VARIANTS = (  # (column key, title, flags)
    ("chain_tree", "chain + tree", 0),
    ("chain_tree_memset", "chain + tree + memset", TREE_ZEROED),
    ("chain_tree_pdl", "chain + tree + PDL zero", TREE_PDL),
    ("chain_tree_v4", "chain + tree v4", TREE_V4),
    ("chain_tree_v4_pdl", "chain + tree v4 + PDL zero", TREE_V4 | TREE_PDL),
)


def cooperative_dependent_launcher():
    """cuLaunchKernelEx of a cooperative grid that may start while the
    stream's previous kernel runs (both launch attributes)."""
    from cupy_moe.runtime import launch

    launch._driver_functions()
    attributes = (launch._LaunchAttribute * 2)()
    attributes[0].id = launch._COOPERATIVE
    attributes[1].id = launch._PROGRAMMATIC_STREAM_SERIALIZATION
    attributes[0].value[0] = attributes[1].value[0] = 1
    config = launch._LaunchConfig(
        attrs=ctypes.cast(attributes, ctypes.POINTER(launch._LaunchAttribute)), num_attrs=2)
    config.grid[1] = config.grid[2] = config.block[1] = config.block[2] = 1

    def launch_ex(handle, grid, threads, shared, stream, params_address, keep=attributes):
        config.grid[0], config.block[0], config.shared_bytes = grid, threads, shared
        config.stream = stream
        status = launch._launch_kernel_ex(ctypes.addressof(config), handle, params_address,
                                          None)
        if status:
            driver.check_status(status)
    return launch_ex


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--tree-only", action="store_true",
                        help="the chain, the tree variants and fused_mapping alone")
    args = parser.parse_args()
    module = cupy.RawModule(code=SOURCE, options=(
        "-std=c++17", f"-I{kernel_dir()}", f"-DIDS={IDS_A_THREAD}", f"-DCOLS={COLUMNS}"))
    functions = {name: module.get_function(name) for name in KERNELS}
    launch_dependent = cooperative_dependent_launcher()
    device = torch.cuda.current_device()  # where .cuda() puts the ids
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    rng = np.random.default_rng()
    shapes = [w for w in load_workloads("fused_mapping") if w.num_tokens >= 4096]
    records = []
    print("us per call in a CUDA graph of 100 calls\n")
    header_done = False
    for w in shapes:
        n, experts = w.num_tokens * w.top_k, w.num_experts
        ids = rng.integers(0, experts, size=(w.num_tokens, w.top_k))
        device_ids = torch.from_numpy(ids).cuda()
        x = worst_case_rows(n, experts, w.alignment)
        shape = plan_for(MappingProblem(w.num_tokens, w.top_k, experts, w.alignment, x,
                                        "int64"), device).shape
        blocks = min(shape.blocks, sms) if shape.cooperative else sms
        if -(-n // blocks) > IDS_A_THREAD * THREADS:
            raise SystemExit(f"{w.label}: {n} slots need more than {IDS_A_THREAD} ids a thread")
        wide = min(WIDE_BLOCKS, sms)
        if experts > COLUMNS * min(blocks, wide) or max(blocks, wide) > THREADS:
            raise SystemExit(f"{w.label}: the scan variant takes at most {COLUMNS} experts a "
                             f"block and {THREADS} blocks")
        if experts % 4:
            raise SystemExit(f"{w.label}: the v4 tree takes E a multiple of 4")
        # counts [B, E], then the scan variant's prefixes [B, E] and totals [E]
        counts = torch.empty((2 * max(blocks, wide) + 1) * experts, dtype=torch.int32,
                             device="cuda")
        token_pos = torch.empty(n, dtype=torch.int32, device="cuda")
        pos_rows = torch.empty(3 * x, dtype=torch.int32, device="cuda")
        shared = 8 * experts

        def launcher(name, cooperative, grid=blocks, tree_flags=0):
            handle = functions[name].kernel.ptr  # the loaded cupy.cuda.Function
            # floor_chain_tree's two trees and parity word, zeroed once: its
            # own for each grid (the kernel keeps them zero between calls)
            tree = torch.zeros(2 * grid * experts + 1, dtype=torch.int32, device="cuda")
            block = FloorArgs(device_ids.data_ptr(), counts.data_ptr(), token_pos.data_ptr(),
                              pos_rows.data_ptr(), tree.data_ptr(), n, experts, x, tree_flags)
            params = (ctypes.c_void_p * 1)(ctypes.addressof(block))
            # floor_zero_tree's arguments: x = the tree's words
            zero_block = FloorArgs(0, 0, 0, 0, tree.data_ptr(), 0, 0, grid * experts, 0)
            zero_params = (ctypes.c_void_p * 1)(ctypes.addressof(zero_block))
            zero_handle = functions["floor_zero_tree"].kernel.ptr

            def call(keep=(tree, block, params, zero_block, zero_params)):  # alive with it
                stream = torch.cuda.current_stream().cuda_stream
                if tree_flags & TREE_PDL:
                    driver.launchKernel(zero_handle, 32, 1, 1, THREADS, 1, 1, 0, stream,
                                        ctypes.addressof(zero_params), 0)
                    launch_dependent(handle, grid, THREADS, shared, stream,
                                     ctypes.addressof(params))
                    return
                if tree_flags & TREE_ZEROED:
                    cupy.cuda.runtime.memsetAsync(tree.data_ptr(), 0, 4 * grid * experts, stream)
                if cooperative:
                    driver.launchCooperativeKernel(handle, grid, 1, 1, THREADS, 1, 1, shared,
                                                   stream, ctypes.addressof(params))
                else:
                    driver.launchKernel(handle, grid, 1, 1, THREADS, 1, 1, shared, stream,
                                        ctypes.addressof(params), 0)
            return call

        count, store = launcher("floor_count", False), launcher("floor_store", False)

        def two_kernels():
            count()
            store()

        def plan_call(device_ids=device_ids, experts=experts, alignment=w.alignment):
            return cupy_moe.fused_mapping(device_ids, experts, alignment=alignment)

        # the tree's prefixes and totals against every block's row summed
        # (the same base a slot; three calls each: the parity's two buffers)
        refused = {}  # flags -> the driver's error (e.g. a cooperative dependent launch)
        for grid in (blocks, wide):
            launcher("floor_chain_sums", True, grid)()
            expected = token_pos.clone()
            for _, title, flags in TREE_VARIANTS:
                tree_call = launcher("floor_chain_tree", True, grid, flags)
                for _ in range(3):
                    token_pos.fill_(-7)
                    try:
                        tree_call()
                    except driver.CUDADriverError as error:
                        refused[flags] = f"{title}: {error}"
                        print(f"{w.label}: {title} refused: {error}", file=sys.stderr)
                        torch.cuda.synchronize()
                        break
                    if not torch.equal(token_pos, expected):
                        raise SystemExit(f"{w.label}: {title} on {grid} blocks disagrees "
                                         "with floor_chain_sums")
        columns = [] if args.tree_only else [
            ("empty", "empty", lambda: launcher("floor_empty", False)),
            ("coop_empty", "coop-empty", lambda: launcher("floor_empty", True)),
            ("barrier", "barrier", lambda: launcher("floor_barrier", True)),
            ("stream", "stream", lambda: launcher("floor_stream", False))]
        columns.append(("chain", "chain", lambda: launcher("floor_chain", True)))
        if not args.tree_only:
            columns += [
                ("two_kernel", "two-kernel", lambda: two_kernels),
                ("chain_sums", "chain + sums", lambda: launcher("floor_chain_sums", True)),
                ("chain_scan", "chain + scan", lambda: launcher("floor_chain_scan", True))]
        variants = [v for v in TREE_VARIANTS if v[2] not in refused]
        columns += [(key, title, lambda flags=flags: launcher("floor_chain_tree", True,
                                                              tree_flags=flags))
                    for key, title, flags in variants]
        columns.append(("chain_wide", "chain, wide",
                        lambda: launcher("floor_chain", True, wide)))
        if not args.tree_only:
            columns.append(("chain_scan_wide", "chain + scan, wide",
                            lambda: launcher("floor_chain_scan", True, wide)))
        columns += [(key + "_wide", title + ", wide",
                     lambda flags=flags: launcher("floor_chain_tree", True, wide, flags))
                    for key, title, flags in variants]
        columns.append(("fused_mapping", "fused_mapping", lambda: plan_call))
        if not header_done:
            print("| shape | blocks | wide | " + " | ".join(t for _, t, _ in columns) + " |")
            print("|---" * (len(columns) + 3) + "|")
            header_done = True
        record = {"label": w.label, "num_slots": n, "num_experts": experts, "num_expanded": x,
                  "blocks": blocks, "wide_blocks": wide, "threads": THREADS,
                  "default_shape": str(shape), "refused": list(refused.values())}
        for key, _, make in columns:
            record[key] = torch_graph_us(make())
        records.append(record)
        print(f"| {w.label} | {blocks} | {wide} | "
              + " | ".join(f"{record[k]:.2f}" for k, _, _ in columns) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "records": records}, f,
                      indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
