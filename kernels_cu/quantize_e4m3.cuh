// float32 -> float8_e4m3fn codes and per-block scale factors, as the NumPy
// oracle computes them (cupy_moe/quantize/numerics.py).
//
// e4m3: clamp to [-448, 448], round to nearest even, every NaN to code 0x7F.
// On sm_89 and newer (unless QUANTIZE_SOFTWARE_E4M3 is set) the hardware
// conversion does two values per instruction (satfinite is the clamp); its
// NaN code is then made 0x7F whatever its sign. Elsewhere an integer
// rounding gives the same codes.
#pragma once

#ifndef QUANTIZE_SOFTWARE_E4M3
#define QUANTIZE_SOFTWARE_E4M3 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !QUANTIZE_SOFTWARE_E4M3
#define QUANT_HW_E4M3 1
#else
#define QUANT_HW_E4M3 0
#endif

#define QUANT_E4M3_MAX 448.0f
#define QUANT_AMAX_FLOOR 1e-4f
#define QUANT_E4M3_NAN 0x7Fu

// One code, by integer rounding (every architecture; the reference of the
// hardware path in the tests).
__device__ __forceinline__ unsigned quant_e4m3_software(float v) {
    const unsigned bits = __float_as_uint(v);
    const unsigned sign = (bits >> 24) & 0x80u;
    unsigned magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return QUANT_E4M3_NAN;
    magnitude = min(magnitude, 0x43E00000u);  // 448 (as bits: same order for magnitudes)
    unsigned code;
    if (magnitude >= 0x3C800000u) {
        // normal e4m3 (>= 2^-6): keep 3 mantissa bits, rounding to nearest
        // even at bit 20, and rebias the exponent from 127 to 7
        code = ((magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20) - (120u << 3);
    } else {
        // subnormal e4m3 (multiples of 2^-9; 8 * 2^-9 is the smallest normal,
        // code 8): |v| * 512 is exact, rintf rounds it to nearest even
        code = static_cast<unsigned>(rintf(__uint_as_float(magnitude) * 512.0f));
    }
    return sign | code;
}

// Four codes, a's in the low byte. a .. d must be results of a float32
// multiply (the ops code x * scale): a NaN among them is then the one NaN
// 0x7FFFFFFF, whatever the operands' signs and payloads (the GPU tests check
// every NaN pattern: quantize_selftest_product_nan), and cvt codes it 0x7F,
// the ops' one NaN code. A raw negative NaN would come out 0xFF: clearing
// the sign bits of NaN codes here cost ~1 instruction an element, 0.5-1
// point of the copy on the SwiGLU prefill shapes (NOTES.md, fifteenth session).
__device__ __forceinline__ unsigned quant_e4m3x4(float a, float b, float c, float d) {
#if QUANT_HW_E4M3
    unsigned short low, high;
    // cvt packs its first source into the upper byte
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(low) : "f"(b), "f"(a));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(high) : "f"(d), "f"(c));
    return static_cast<unsigned>(low) | (static_cast<unsigned>(high) << 16);
#else
    return quant_e4m3_software(a) | (quant_e4m3_software(b) << 8) |
           (quant_e4m3_software(c) << 16) | (quant_e4m3_software(d) << 24);
#endif
}

// Scale factor and scale of a block whose NaN-free |v| maximum is amax:
// amax floored at 1e-4, sf = amax / 448; round_sf rounds sf's bits up to a
// power of two and takes scale = 1 / sf, else scale = 448 / amax. (IEEE
// divisions; an infinite amax gives sf = inf, scale = 0.) With round_sf,
// 1 / sf is exact and written from sf's exponent, not divided: sf = 2^(E -
// 127) with E in [105, 247] (1e-4 / 448 <= sf <= 2^120, as float32's
// largest / 448 rounds up to 2^120), so 1 / sf = 2^(127 - E), whose bits
// are (254 - E) << 23; or sf = inf (E = 255): 0. A link shorter than the
// division it replaced, which measured level with it on the H100
// (benchmarks/NOTES.md, thirty-fifth session).
__device__ __forceinline__ void quant_block_scales(float amax, bool round_sf, float& sf,
                                                   float& scale) {
    amax = fmaxf(amax, QUANT_AMAX_FLOOR);
    sf = __fdiv_rn(amax, QUANT_E4M3_MAX);
    if (round_sf) {
        const unsigned bits = (__float_as_uint(sf) + 0x7FFFFFu) & 0x7F800000u;
        sf = __uint_as_float(bits);
        scale = bits == 0x7F800000u ? 0.0f : __uint_as_float((254u << 23) - bits);
    } else {
        scale = __fdiv_rn(QUANT_E4M3_MAX, amax);
    }
}
