// The emulation's stand-ins for PTX conversions, exported for the tests that
// compare them with NumPy and ml_dtypes on every half and on hard floats.
#include "cuda_on_cpu.h"

namespace emu {
thread_local Block* current_block = nullptr;
thread_local Fiber* current_fiber = nullptr;
}

extern "C" void emu_f16_to_f32(const unsigned short* in, float* out, long n) {
    for (long i = 0; i < n; ++i) out[i] = emu::cvt_f32_f16(in[i]);
}

extern "C" void emu_f32_to_f16(const float* in, unsigned short* out, long n) {
    for (long i = 0; i < n; ++i) out[i] = emu::cvt_rn_f16_f32(in[i]);
}

extern "C" void emu_f32_to_e4m3x2(const float* in, unsigned short* out, long pairs) {
    for (long i = 0; i < pairs; ++i) out[i] = emu::cvt_e4m3x2(in[2 * i], in[2 * i + 1]);
}
