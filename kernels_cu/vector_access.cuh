// Raw-byte vector accesses shared by the kernels that only move data.
//
// Rows are moved as VEC_BYTES-wide accesses (16, 8, 4, 2 or 1 bytes); the
// host picks the widest that divides the row length and the base addresses.
// Loads and stores carry the evict-first (streaming) cache hint: each source
// row is read once and no output is read back by the kernel that writes it.
#pragma once

typedef long long i64;

template <int N> struct VecOf;
template <> struct VecOf<16> { typedef uint4 type; };
template <> struct VecOf<8> { typedef uint2 type; };
template <> struct VecOf<4> { typedef unsigned int type; };
template <> struct VecOf<2> { typedef unsigned short type; };
template <> struct VecOf<1> { typedef unsigned char type; };

template <typename T>
__device__ __forceinline__ T load_once(const T* p) {
    return __ldcs(p);
}

template <typename T>
__device__ __forceinline__ void store_once(T* p, T v) {
    __stcs(p, v);
}
