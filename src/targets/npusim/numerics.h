// npusim numerics: what the AIE2P (XDNA 2) kernels do to numbers, for the kernels the
// engine runs. bf16 in and out of tiles with round-to-nearest-even, fp32 accumulation,
// and the approximations the mlir-aie aie2p kernels use for exp, rsqrt, tanh and SiLU.
// Each approximation states its error bound; tests/test_npusim_numerics.cc holds them to it.
//
// What the device kernels do (Xilinx/mlir-aie aie_kernels/aie2p, read for this model):
// - softmax.cc: exp(x) = exp2(x * log2e) with log2e as a bf16 constant (1.4453125, not
//   1.442695) multiplied in the fp32 accumulator; exp2 returns bf16 (aie::exp2<bfloat16>).
//   exp2_bf16.h does 2^x on AIE2 as 2^round(x) * p(f), p a cubic in f = x - round(x) with
//   bf16 products (within 0.2% of 2^f), added into the fp32 exponent field. AIE2P has a
//   hardware exp2 whose accuracy is not documented; we model it with that same cubic
//   (bf16 operands, fp32 accumulate) so that the error is at least as large as the AIE2 one.
// - rms_norm.cc: sum of squares in fp32, aie::invsqrt (hardware, accuracy not documented),
//   and the inverse RMS rounded to bf16 before the bf16 multiply. We model invsqrt as the
//   classic bit-trick estimate plus one Newton step (relative error <= 1.8e-3).
// - silu.cc: silu(x) = x * 0.5 * (1 + tanh(x / 2)) with aie::tanh (hardware), every product
//   rounded to bf16. We model tanh through the exp2 approximation: tanh(y) = 1 - 2 / (1 + e^2y).
#pragma once
#include <cstdint>

#include "util/half.h"

namespace tessera::npusim {

// The scalar conversions (util/half.h) next to the array ones below, so that an unqualified
// bf16_to_f32(x) inside this namespace finds both overloads instead of only the arrays.
using tessera::bf16_to_f32;
using tessera::f32_to_bf16;

// bf16 round-to-nearest-even, as when a value leaves the accumulator for a bf16 register.
inline float round_bf16(float x) { return tessera::bf16_to_f32(tessera::f32_to_bf16(x)); }

// The bf16 constant the aie2p softmax kernel uses for log2(e).
inline constexpr float kLog2eBf16 = 1.4453125f;

// 2^x as the kernels compute it, rounded to bf16. Clamped to [-126, 127] (0 below the
// normal range, as the kernel's exponent-field add clamps to +0).
// Bound: |exp2_bf16(x) - 2^x| <= 6.5e-3 * 2^x for x in [-126, 127].
float exp2_bf16(float x);
inline constexpr double kExp2RelBound = 6.5e-3;

// e^x as the softmax kernels compute it: exp2_bf16(bf16(x) * kLog2eBf16).
// Bound (x already bf16): |exp_bf16(x) - e^x| <= (6.5e-3 + 1.82e-3 * |x| + 1.3e-3) * e^x
// (the bf16 log2e alone is off by 0.18%, so the error grows with |x|; softmax subtracts
// the row maximum first, so |x| is small where e^x matters).
float exp_bf16(float x);
inline double exp_rel_bound(double x) { return 6.5e-3 + 1.82e-3 * (x < 0 ? -x : x) + 1.3e-3; }

// 1/sqrt(x) for x > 0: bit-trick estimate + one Newton step, in fp32 (not rounded).
// Bound: relative error <= 1.8e-3.
float rsqrt_approx(float x);
inline constexpr double kRsqrtRelBound = 1.8e-3;

// tanh(x) through exp2_bf16, rounded to bf16. Bound: |tanh_bf16(x) - tanh(x)| <= 8e-3.
float tanh_bf16(float x);
inline constexpr double kTanhAbsBound = 8e-3;

// silu(x) = x * sigmoid(x) as the aie2p silu kernel: x * bf16(0.5 * bf16(1 + tanh(bf16(x/2)))),
// rounded to bf16. Bound: |silu_bf16(x) - silu(x)| <= 6e-3 * |x| + 1e-6.
float silu_bf16(float x);
inline constexpr double kSiluRelBound = 6e-3;

// Vector helpers for kernels (bf16 in L1, fp32 accumulate), written so the compiler
// vectorizes them: the engine must run a Llama-1B decode step in well under 2 s.
void bf16_to_f32(const uint16_t* in, float* out, int64_t n);
void f32_to_bf16(const float* in, uint16_t* out, int64_t n);  // round-to-nearest-even
// The same under names that cannot be mistaken for the scalar conversions.
inline void bf16_to_f32_array(const uint16_t* in, float* out, int64_t n) { bf16_to_f32(in, out, n); }
inline void f32_to_bf16_array(const float* in, uint16_t* out, int64_t n) { f32_to_bf16(in, out, n); }
// sum_i a[i] * b[i] in fp32 over 32 lane accumulators (the bf16 vector width), then reduced.
float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n);
// C[m, n] += A[m, k] * B[k, n], all row-major with leading dimensions k, n, n; bf16 operands,
// fp32 accumulator (the mmul unit's contract).
void mmul_bf16(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t k, int64_t n);

}  // namespace tessera::npusim
