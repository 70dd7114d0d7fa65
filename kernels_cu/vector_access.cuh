// Raw-byte vector accesses shared by the kernels that only move data.
//
// Rows are moved as VEC_BYTES-wide accesses (16, 8, 4, 2 or 1 bytes); the
// host picks the widest that divides the row length and the base addresses.
// Loads and stores carry the evict-first (streaming) cache hint: each source
// row is read once and no output is read back by the kernel that writes it.
// A module may choose other hints (reduce_fused's default where rows may be in
// L2, launch-shape sweeps, expand tunings): VECTOR_LOAD_HINT 1
// plain (L1 and L2), 2 .cg (L2 only), 3 .nc (the read-only path);
// VECTOR_STORE_HINT 1 plain, 2 .cg. 0, the default, is .cs for both.
#pragma once

#ifndef VECTOR_LOAD_HINT
#define VECTOR_LOAD_HINT 0
#endif
#ifndef VECTOR_STORE_HINT
#define VECTOR_STORE_HINT 0
#endif

typedef long long i64;

template <int N> struct VecOf;
template <> struct VecOf<16> { typedef uint4 type; };
template <> struct VecOf<8> { typedef uint2 type; };
template <> struct VecOf<4> { typedef unsigned int type; };
template <> struct VecOf<2> { typedef unsigned short type; };
template <> struct VecOf<1> { typedef unsigned char type; };

// A load under hint HINT (VECTOR_LOAD_HINT's values): for a kernel whose
// accesses take more than the module's one hint.
template <int HINT, typename T>
__device__ __forceinline__ T load_hinted(const T* p) {
    if constexpr (HINT == 1) return *p;
    else if constexpr (HINT == 2) return __ldcg(p);
    else if constexpr (HINT == 3) return __ldg(p);
    else return __ldcs(p);
}

template <typename T>
__device__ __forceinline__ T load_once(const T* p) {
    return load_hinted<VECTOR_LOAD_HINT>(p);
}

template <typename T>
__device__ __forceinline__ void store_once(T* p, T v) {
#if VECTOR_STORE_HINT == 1
    *p = v;
#elif VECTOR_STORE_HINT == 2
    __stcg(p, v);
#else
    __stcs(p, v);
#endif
}
