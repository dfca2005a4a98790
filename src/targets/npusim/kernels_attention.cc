// The attention worker kernel (prefill and decode): flash-style over key tiles with an
// online softmax, causal mask from the start position, GQA through the mapping (each
// column streams one kv head's keys and values to the workers holding its query heads).
#include <algorithm>
#include <cstring>
#include <limits>

#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/numerics.h"

namespace tessera::npusim::detail {

namespace {

// Objects: Q and O slots are [tq rows][qpw heads][hd] bf16; a KV object is kt keys of
// [k (hd) | v (hd)] bf16. Per (row, head): scores s = (q . k) * scale in fp32 over bf16
// operands, running max m, correction exp_bf16(m_old - m), p = exp_bf16(s - m) (bf16), l and
// acc in fp32; out = bf16(acc * (1 / l)).
void attention_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t pos0 = p["pos0"], hd = p["hd"], tq = p["tq"], kt = p["kt"], qpw = p["qpw"], kpc = p["kpc"];
  const int64_t NQT = p["q_tiles"], NKT = p["k_tiles"];
  const float scale = p["scale"];
  const int Q = ctx.fifo(p["q_fifo"]), KV = ctx.fifo(p["kv_fifo"]), O = ctx.fifo(p["o_fifo"]);
  const int64_t rows = tq * qpw;
  auto st = ctx.buffer("state");
  float* acc = reinterpret_cast<float*>(st.data());
  float* m = acc + rows * hd;
  float* l = m + rows;
  float* s = l + rows;
  std::vector<float> vrow(static_cast<size_t>(hd));
  for (int64_t i = 0; i < kpc; ++i) {
    for (int64_t qt = 0; qt < NQT; ++qt) {
      const uint16_t* q = ctx.acquire(Q).bf16();
      uint16_t* o = ctx.acquire(O).bf16();
      std::fill_n(acc, rows * hd, 0.0f);
      std::fill_n(m, rows, -std::numeric_limits<float>::infinity());
      std::fill_n(l, rows, 0.0f);
      const int64_t last_pos = pos0 + (qt + 1) * tq - 1;
      for (int64_t kb = 0; kb < NKT; ++kb) {
        const uint16_t* kv = ctx.acquire(KV).bf16();
        const int64_t first_key = kb * kt;
        if (first_key <= last_pos) {
          for (int64_t tt = 0; tt < tq; ++tt) {
            const int64_t valid = std::min(kt, pos0 + qt * tq + tt - first_key + 1);
            if (valid <= 0) continue;
            for (int64_t j = 0; j < qpw; ++j) {
              const int64_t row = tt * qpw + j;
              const uint16_t* qv = q + row * hd;
              float mt = -std::numeric_limits<float>::infinity();
              for (int64_t jj = 0; jj < valid; ++jj) {
                s[jj] = dot_bf16(qv, kv + jj * 2 * hd, hd) * scale;
                mt = std::max(mt, s[jj]);
              }
              const float m_new = std::max(m[row], mt);
              float* a = acc + row * hd;
              if (m[row] != -std::numeric_limits<float>::infinity() && m_new != m[row]) {
                const float corr = exp_bf16(m[row] - m_new);
                l[row] *= corr;
                for (int64_t dd = 0; dd < hd; ++dd) a[dd] *= corr;
              }
              m[row] = m_new;
              for (int64_t jj = 0; jj < valid; ++jj) {
                const float pj = exp_bf16(s[jj] - m_new);
                l[row] += pj;
                cast_to_f32(kv + jj * 2 * hd + hd, vrow.data(), hd);
                for (int64_t dd = 0; dd < hd; ++dd) a[dd] += pj * vrow[size_t(dd)];
              }
            }
          }
        }
        ctx.release(KV);
      }
      for (int64_t row = 0; row < rows; ++row) {
        const float inv = l[row] > 0 ? 1.0f / l[row] : 0.0f;
        for (int64_t dd = 0; dd < hd; ++dd) o[row * hd + dd] = tessera::f32_to_bf16(acc[row * hd + dd] * inv);
      }
      ctx.release(O);
      ctx.release(Q);
    }
  }
}

}  // namespace

void register_attention_kernels(Engine& e) { e.register_kernel("attention_bf16", attention_kernel); }

}  // namespace tessera::npusim::detail
