// exp of float32 for the swiglu kernels, and the SwiGLU arithmetic: the one
// definition the NumPy oracle (cupy_moe/quantize/numerics.py: exp_f32,
// swiglu_f32) computes too, operation for operation, so both give the same
// bits.
//
// Every exp step is one IEEE float32 operation rounded to nearest even: a
// fused multiply-add (__fmaf_rn, one rounding of the exact a * b + c), or a
// multiply or add (__fmul_rn / __fadd_rn / __fsub_rn, which the compiler never
// contracts into an FMA). NumPy has no fma; the oracle computes each one
// exactly rounded with cupy_moe/combine/fma.py. The constants are float32 bit
// patterns; numerics.EXP_CONSTANT_BITS holds the same (a CPU test compares).
//
//   x = fmin(fmax(x, -86.5), 87)         a NaN x becomes -86.5
//   t = fma(x, LOG2E, SHIFTER)           t's low bits hold n = rint(x log2 e)
//   n = t - SHIFTER                      exact
//   r = fma(n, -LN2_LO, fma(n, -LN2_HI, x))   Cody-Waite; the inner one is exact
//   q = fma(fma(fma(fma(fma(C5, r, C4), r, C3), r, C2), r, C1), r, 1)
//   m = fma(q, r, 1)                     exp(r) ~ 1 + r q(r): Horner to the end
//   exp = bits(m) + (bits(t) << 23)      n added to m's exponent field
//
// Thirteen instructions: the clamp's two, the reduction's four, the six FMAs
// of the polynomial and the exponent add (one LEA). The swiglu kernels are
// bound in part by their instruction issue: Horner to the end is one
// instruction fewer than 1 + fma(r * r, p, r) with the same degree and, with
// coefficients fitted for this evaluation order, no less accurate
// (benchmarks/NOTES.md, sixteenth session).
//
// The clamp keeps every result a normal float32, so the exponent add is
// exact: exp saturates at exp(-86.5) ~ 2.7e-38 and exp(87) ~ 6.1e37 (enough
// for silu: 1 + exp(-g) is 1 for g > 17, and silu(g) is below 1e-35 in
// magnitude for g < -87). On [-86.5, 87] the error is at most 1.02 ulp of
// float64's exp (numerics.EXP_MAX_ULP, measured on every float32 input there).
// exp(+inf) = exp(87); exp(-inf) = exp(NaN) = exp(-86.5): no NaN ever enters
// the exponent-field add, whose result would depend on the NaN's payload
// (silu(NaN) is NaN all the same: g * y with g NaN).
#pragma once

#define QUANT_EXP_LOG2E 0x3FB8AA3Bu
#define QUANT_EXP_SHIFTER 0x4B400000u
#define QUANT_EXP_LN2_HI 0x3F317200u
#define QUANT_EXP_LN2_LO 0x35BFBE8Eu
#define QUANT_EXP_C1 0x3EFFFFFCu
#define QUANT_EXP_C2 0x3E2AAA0Bu
#define QUANT_EXP_C3 0x3D2AAC1Au
#define QUANT_EXP_C4 0x3C0935D5u
#define QUANT_EXP_C5 0x3AB571A9u
#define QUANT_EXP_LOW 0xC2AD0000u   // -86.5
#define QUANT_EXP_HIGH 0x42AE0000u  // 87

__device__ __forceinline__ float quant_exp_f32(float x) {
    const float shifter = __uint_as_float(QUANT_EXP_SHIFTER);
    // fmaxf / fminf: a NaN x becomes LOW (np.fmax / np.fmin do the same)
    x = fminf(fmaxf(x, __uint_as_float(QUANT_EXP_LOW)), __uint_as_float(QUANT_EXP_HIGH));
    const float t = __fmaf_rn(x, __uint_as_float(QUANT_EXP_LOG2E), shifter);
    const float n = __fsub_rn(t, shifter);
    float r = __fmaf_rn(n, -__uint_as_float(QUANT_EXP_LN2_HI), x);
    r = __fmaf_rn(n, -__uint_as_float(QUANT_EXP_LN2_LO), r);
    float q = __fmaf_rn(__uint_as_float(QUANT_EXP_C5), r, __uint_as_float(QUANT_EXP_C4));
    q = __fmaf_rn(q, r, __uint_as_float(QUANT_EXP_C3));
    q = __fmaf_rn(q, r, __uint_as_float(QUANT_EXP_C2));
    q = __fmaf_rn(q, r, __uint_as_float(QUANT_EXP_C1));
    q = __fmaf_rn(q, r, 1.0f);
    const float m = __fmaf_rn(q, r, 1.0f);
    // m * 2^n by adding n to m's exponent field: bits(t) << 23 is n << 23
    // (mod 2^32: bits(SHIFTER) << 23 is 0), and m's exponent stays in range
    return __uint_as_float(__float_as_uint(m) + (__float_as_uint(t) << 23));
}

// 1 / d rounded to nearest even, for d in [1, 2^126) (NaN gives NaN): the
// reciprocal approximation refined by one Newton step with FMAs. This is the
// fast path CUDA's own correctly rounded reciprocal (__frcp_rn) takes for
// such d; here without its test for the other exponents and its slow path,
// which cost a third of the swiglu kernel's instructions. The GPU tests check
// it against __frcp_rn on every float32 of the range
// (quantize_selftest_reciprocal in quantize.cu).
__device__ __forceinline__ float quant_rcp_1_to_2p126(float d) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(d));
    const float t = __fmaf_rn(d, y, -1.0f);
    return __fmaf_rn(y, -t, y);
}

// silu(g) * up * weight, in this order: e = exp(-g), y = 1 / (1 + e) (the
// IEEE reciprocal: 1 + e is in [1, 2^126) or NaN), s = g * y,
// (s * up) * weight. numerics.swiglu_f32 is the same sequence.
__device__ __forceinline__ float quant_swiglu_f32(float gate, float up, float weight) {
    const float e = quant_exp_f32(-gate);
    const float silu = __fmul_rn(gate, quant_rcp_1_to_2p126(__fadd_rn(1.0f, e)));
    return __fmul_rn(__fmul_rn(silu, up), weight);
}
