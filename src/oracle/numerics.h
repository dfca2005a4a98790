// What a target declares about its numbers (issue 16: limits from each target's numerics):
// where it rounds (to bf16 or fp16), what it accumulates in, and which approximations it
// uses for exp, 1/sqrt and SiLU. The oracle's emulated twins (oracle/emulate.h) run the
// reference ops under these declarations; the error of that emulation against the exact
// oracle is the error the target's kernel is expected to have, and phase 1's limits are a
// stated margin above it. Accumulation is fp32 or wider on every target tessera has; a
// target that accumulates in bf16 would declare it here and be held to that.
#pragma once
#include <string>

namespace tessera::oracle {

// Q8x2_32: per 32-value block, x = d * (hi + lo / 254) with d = max|x| / 127 (fp32), hi =
// x / d and lo = (x / d - hi) * 254 each rounded to nearest even into int8 (a block-wise
// rounding: round_all only; the cpu's quantized GEMV input).
enum class Precision { F32, BF16, F16, Q8x2_32 };
const char* precision_name(Precision p);
float round_to(Precision p, float x);

struct Numerics {
  std::string name;                             // "cpu (bf16 matmul operands, fp32 elsewhere)"
  Precision weights = Precision::BF16;          // matrices and the embedding table as stored
  Precision matmul_inputs = Precision::BF16;    // activations rounded before a GEMM/GEMV
  Precision matmul_outputs = Precision::F32;    // drained from the fp32 accumulator
  Precision activations = Precision::F32;       // inputs and outputs of every other op
  Precision kv_cache = Precision::F16;          // keys and values as cached
  Precision norm_weights = Precision::F32;      // RMSNorm gains as the kernel reads them
  Precision attention_q = Precision::F32;       // queries as the score product reads them
  Precision softmax_probs = Precision::F32;     // attention probabilities before the V product
  bool probs_normalized = false;                // divided by their sum before the V product (else after)
  Precision rope_table = Precision::F32;        // cos/sin as the kernel reads them
  Precision norm_scale = Precision::F32;        // RMSNorm's 1/rms as the kernel multiplies by it
  bool norm_rounds_product = false;             // bf16(bf16(x * inv) * g) rather than x * inv * g
  // Approximations (nullptr: exact to fp32, as the oracle).
  float (*exp)(float) = nullptr;
  float (*rsqrt)(float) = nullptr;
  float (*silu)(float) = nullptr;
  std::string approximations;  // one line for kernel_registry ("" when exact)
  std::string describe() const;  // one line naming every declared rounding point
};

}  // namespace tessera::oracle
