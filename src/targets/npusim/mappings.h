// npusim kernel set: one mapping generator per kernel class, each parameterized by its
// tile sizes and herd shape, returning a Launch (spatial.h) that the checker judges, the
// engine runs and the timing model prices; plus the Worker functions the engine calls
// (kernels_*.cc, registered by register_kernel_set) and defaults per shape that fit a
// Device (on xdna2: 64 KiB L1, every fifo double-buffered).
//
// Common layout of the "herd over rows/blocks" mappings (GEMV, row ops, element-wise):
// the work is cut into blocks; worker (c, r) of a C x R herd takes blocks
// g = b * C*R + c*R + r (b = 0, 1, ...), so that each column's R workers take R
// consecutive blocks and each column's memtile object is one contiguous DDR range: one
// Split fifo per column brings the inputs (one shim MM2S channel each), one Join fifo per
// column drains the outputs, and operands every worker needs (x of a GEMV, the RMSNorm
// weight, the RoPE table) are broadcast from column 0.
//
// Numerics (numerics.h): operands bf16 in L1, fp32 accumulators, bf16 rounding where a
// result leaves the tile, except where an op drains fp32 (said per op below).
//
// Faults (MappingFaults) let a plan or a test produce the mapping bugs the debug skills must
// find: a transposed access pattern (wrong numbers), a stale buffer (an input fifo marked
// resident: the second call computes on the first call's data), an over-size tile (the
// checker refuses it: l1-overflow with needed > available) and a BD-hungry transfer (one BD
// per run: the checker refuses it as bd-exhaustion).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "targets/npusim/device.h"
#include "targets/npusim/mappings_gemm.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

class Engine;

struct MappingFaults {
  bool transposed_pattern = false;  // bad-access-pattern: the main operand is walked transposed
  bool stale_buffer = false;        // stale-buffer: the per-call input fifo is marked resident
  bool l1_overflow = false;         // l1-overflow: the streamed tile is enlarged past L1 (no fit)
  bool bd_exhaustion = false;       // bd-exhaustion: the main transfer is cut into one BD per run
  bool dma_oversubscribed = false;  // dma-channels: the input is sent twice through column 0's shim
  bool any() const { return transposed_pattern || stale_buffer || l1_overflow || bd_exhaustion || dma_oversubscribed; }
  std::string key() const;  // "" or "T", "S", "O", "B" letters, for cache keys and names
};

// A herd of cols x rows compute tiles (columns 0.., rows first_compute_row..).
struct Herd {
  int cols = 1, rows = 1;
  int size() const { return cols * rows; }
};

// The largest herd (cols <= device columns, rows <= compute rows; cols first) whose size
// divides `blocks` (so that every worker gets the same number of blocks).
Herd herd_for(int64_t blocks, const Device& d, int max_cols = 0, int max_rows = 0);

// ---------------------------------------------------------------------------------------
// GEMV (decode projections, LM head): y[N] = W[N, K] x[K] (+ bias[N]).
// W bf16 [N, K] row-major in DDR, x bf16, bias bf16, y fp32 (drained from the fp32
// accumulator: it is a partial sum when K is split and it feeds the host's fp32 hidden
// state). Worker blocks are `rb` rows; each row is reduced in K chunks of `kc` <=
// Device::gemv_max_k (the bf16 vector kernel's limit) whose fp32 partial sums accumulate in
// L1. Fifos per column c: W<c> split (object = R*rb rows x kc, each worker its rb rows),
// Y<c> join (R*rb floats); x broadcast to every worker from column 0 (X, one object per K
// chunk, re-sent per row block when K is split); bias (if any) split per column (B<c>).
// `resident`: W is filled on the first call only and stays in L1 (depth = all its objects;
// the launch name must then be unique per weight).
// Quantized weights (W4A16, W8A16: `w` a block type, weight_blocks.h): W is [N, K / 32]
// blocks in DDR and its fifos move blocks (object = R*rb rows x kc/32 blocks, kc a multiple of
// 32); the workers run gemv_blocks, which unpacks each block and scales its partial sum.
struct GemvShape {
  int64_t N = 0, K = 0;
  bool bias = false;
  ElemType w = ElemType::BF16;
};
struct GemvTiles {
  int64_t rb = 0;  // rows per worker block (0: default)
  int64_t kc = 0;  // K chunk (0: default; must divide K and be <= gemv_max_k)
  Herd herd{0, 0};  // 0: herd_for(N)
};
struct GemvOptions {
  std::string name = "gemv";
  bool resident = false;
  MappingFaults faults;
  std::string w = "W", x = "X", bias = "B", y = "Y";  // DDR tensor names
};
GemvTiles default_gemv_tiles(const GemvShape& s, const Device& d, bool resident = false);
// The tiles (herd, rb, kc) the timing model prices fastest among those the checker accepts
// (tile-tune); the default when nothing beats it. Searches every herd that divides N, every
// K chunk of whole vectors, every row block that fits L1 double-buffered.
GemvTiles tune_gemv_tiles(const GemvShape& s, const Device& d);
// Whether the weights of `shapes`, `copies` times over (a layer's GEMVs for every layer), can
// stay resident in L1 together: each launch keeps its slice on its workers' tiles for the
// whole run, so a tile holds its slice of every one of them at once, beside the working
// buffers of the largest launch (default tiles with resident = true).
bool gemvs_fit_resident(const std::vector<GemvShape>& shapes, int64_t copies, const Device& d);
Launch gemv_launch(const GemvShape& s, const GemvTiles& t, const Device& d, const GemvOptions& o = {});

// ---------------------------------------------------------------------------------------
// GEMM (prefill projections): helper-11's gemm_launch (mappings_gemm.h), with default tiles
// chosen here for a Linear weight (B as [N, K]); M is padded to whole tiles by the caller.
struct GemmPlan {
  GemmShape shape;  // M padded
  GemmTiles tiles;
  GemmHerd herd;
};
// b_type: the weight's element type; a block type keeps k (and k_l2) whole blocks and counts
// B's L1 objects in blocks.
GemmPlan default_gemm_plan(int64_t M, int64_t K, int64_t N, const Device& d, ElemType c_type = ElemType::F32,
                           ElemType b_type = ElemType::BF16);

// ---------------------------------------------------------------------------------------
// Row operations over `rows` rows of `n` elements, one row-block of `rt` rows per object:
// RMSNorm (also per head: rows = T * heads, n = head_dim), softmax, bias add.
// In bf16 (X<c> split), out bf16 (Y<c> join) except bias add (fp32 in and out);
// the row weight (gamma / bias, n elements) broadcast from column 0 (G).
enum class RowOp { RmsNorm, Softmax, BiasAdd };
const char* row_op_name(RowOp op);
struct RowShape {
  int64_t rows = 0, n = 0;
};
struct RowTiles {
  int64_t rt = 0;  // rows per worker block (0: default)
  Herd herd{0, 0};
};
struct RowOptions {
  std::string name;  // "": row_op_name
  double eps = 1e-6;  // RMSNorm
  MappingFaults faults;
  std::string x = "X", g = "G", y = "Y";
};
RowTiles default_row_tiles(RowOp op, const RowShape& s, const Device& d);
Launch row_launch(RowOp op, const RowShape& s, const RowTiles& t, const Device& d, const RowOptions& o = {});

// ---------------------------------------------------------------------------------------
// Element-wise ops over n elements in blocks of `tile`: SiLU x mul (gate, up bf16 -> bf16,
// silu_bf16 then a bf16 product) and residual add (fp32 + fp32 -> fp32: the AIE2P vector
// unit adds fp32 natively, and the residual stream is the hidden state the runner keeps in
// fp32). Two split inputs per column (A<c>, B<c>), one join output (Y<c>).
enum class EltOp { SiluMul, Add };
const char* elt_op_name(EltOp op);
struct EltTiles {
  int64_t tile = 0;  // elements per worker block (0: default)
  Herd herd{0, 0};
};
struct EltOptions {
  std::string name;
  MappingFaults faults;
  std::string a = "A", b = "B", y = "Y";
};
EltTiles default_elt_tiles(EltOp op, int64_t n, const Device& d);
Launch elt_launch(EltOp op, int64_t n, const EltTiles& t, const Device& d, const EltOptions& o = {});

// ---------------------------------------------------------------------------------------
// RoPE (half-split pairing) on x [T, heads * head_dim] at positions pos0.. (in bf16, out
// bf16). The table CS [T, head_dim] (cos of the head_dim/2 frequencies, then their sin) is
// computed on the host in fp32 (angle = position * inv_freq as an fp32 product, then cos and
// sin in fp32, as transformers does) and streamed as bf16: the vector unit multiplies bf16
// operands anyway, bf16 halves the table's DMA, and rounding cos/sin after the fp32 angle
// keeps the error at 2^-9 relative whatever the position (the angle, the part that loses
// precision at large positions, is never held in bf16). Herd over heads: worker w rotates
// hpw = heads / herd heads of every position; X<c> split, Y<c> join, CS broadcast.
struct RopeShape {
  int64_t T = 0, heads = 0, head_dim = 0;
};
struct RopeTiles {
  Herd herd{0, 0};
};
struct RopeOptions {
  std::string name = "rope";
  MappingFaults faults;
  std::string x = "X", cs = "CS", y = "Y";
};
RopeTiles default_rope_tiles(const RopeShape& s, const Device& d);
Launch rope_launch(const RopeShape& s, const RopeTiles& t, const Device& d, const RopeOptions& o = {});
// The table for positions pos0 .. pos0 + T - 1 (fp32; the caller rounds it to bf16).
std::vector<float> rope_table(int64_t T, int64_t pos0, const std::vector<float>& inv_freq);

// ---------------------------------------------------------------------------------------
// Attention with causal mask and GQA, flash-style over key tiles (online softmax), for
// prefill (T query rows at positions pos0..pos0+T-1) and decode (T = 1).
// Q [T, heads * hd] bf16; KV the layer's cache, bf16 rows [K (kv_dim) | V (kv_dim)] per
// position (one tensor so that one shim channel streams a kv head's keys and values
// together), at least round_up(pos0 + T, kt) rows; O [T, heads * hd] bf16.
// Herd: columns over kv heads (kpc = n_kv / cols kv heads each, in turn), rows over the
// query heads of a group (qpw = group / rows each). Per column: Q<c> split (memtile
// re-layout per worker), KV<c> broadcast (kt keys x [k | v] per object, every key tile for
// every query tile: fully masked tiles are skipped in compute, not in DMA), O<c> join.
// Scores q.k in fp32 (bf16 operands) times head_dim^-0.5, running max, p = exp_bf16(s - m),
// rescale by exp_bf16(m_old - m), l and acc in fp32, out = bf16(acc / l).
struct AttnShape {
  int64_t T = 1, pos0 = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t keys() const { return pos0 + T; }
};
struct AttnTiles {
  int64_t tq = 0;  // query rows per tile (0: default)
  int64_t kt = 0;  // keys per tile (0: default)
  Herd herd{0, 0};
};
struct AttnOptions {
  std::string name = "attention";
  float scale = 0;  // 0: head_dim^-0.5
  MappingFaults faults;
  std::string q = "Q", kv = "KV", o = "O";
};
AttnTiles default_attn_tiles(const AttnShape& s, const Device& d);
// Rows of the KV tensor the launch reads (keys rounded up to whole key tiles).
int64_t attn_kv_rows(const AttnShape& s, const AttnTiles& t);
Launch attention_launch(const AttnShape& s, const AttnTiles& t, const Device& d, const AttnOptions& o = {});

// ---------------------------------------------------------------------------------------
// Embedding lookup: out[t] = table[ids[t]] (bf16 rows; a pure row gather). One worker per
// column; its fill fifo E<c> is one BD per token row (the DMA does the gather), its drain
// O<c> writes the rows back in order; token t goes to column t % cols. Rows longer than
// `hc` are moved in chunks. The shim's BDs bound the tokens of one launch
// (embedding_max_tokens); callers cut longer sequences into several launches.
struct EmbedTiles {
  int64_t hc = 0;  // elements per object (0: default, a divisor of hidden)
  int cols = 0;
};
struct EmbedOptions {
  std::string name = "embedding";
  MappingFaults faults;
  std::string table = "E", out = "O";
};
EmbedTiles default_embed_tiles(int64_t hidden, int64_t T, const Device& d);
int64_t embedding_max_tokens(int64_t hidden, const EmbedTiles& t, const Device& d);
Launch embedding_launch(const std::vector<int32_t>& ids, int64_t vocab, int64_t hidden, const EmbedTiles& t,
                        const Device& d, const EmbedOptions& o = {});

// ---------------------------------------------------------------------------------------
// Registers every worker kernel of the set (and helper-11's GEMM kernel) with the engine.
void register_kernel_set(Engine& engine);

namespace detail {
void register_linear_kernels(Engine& e);     // kernels_linear.cc
void register_row_kernels(Engine& e);        // kernels_rows.cc (rows, eltwise, rope, embedding)
void register_attention_kernels(Engine& e);  // kernels_attention.cc
// Shared by the generators (mappings_common.cc).
Worker make_worker(const std::string& name, Tile tile, const std::string& kernel);
std::vector<FifoEnd> column_ends(const Herd& h, int c, const Device& d, int64_t slice);  // split/join slices
std::vector<FifoEnd> all_ends(const Herd& h, const Device& d);                          // broadcast to all
// Applies the generic faults to `f` (the launch's main per-call input): stale_buffer marks
// it resident; bd_exhaustion cuts its transfer into more BDs than its shim holds.
void apply_fifo_faults(ObjectFifo& f, const MappingFaults& faults, const Device& d);
// The dma-channels fault: the first fill fifo of `tensor` duplicated under another name, so
// that its shim tile needs one more MM2S channel than it has (the checker refuses it).
void oversubscribe_dma(Launch& l, const std::string& tensor);
int64_t largest_divisor_at_most(int64_t n, int64_t cap);
// Array casts (round-to-nearest-even down), local so the kernel set does not depend on
// numerics.h's array helper names.
void cast_to_bf16(const float* in, uint16_t* out, int64_t n);
void cast_to_f32(const uint16_t* in, float* out, int64_t n);
// The per-column fifo of the block layout: a split (fill) or join (drain) through column c's
// memtile, each of the column's workers its `slice` of every object (forward for one row).
ObjectFifo column_fifo(const std::string& name, const std::string& tensor, FifoDir dir, ElemType type, int c,
                       const Herd& h, const Device& d, int64_t slice, std::vector<AccessPattern> ddr);
// The broadcast fifo from column 0 to every worker of the herd.
ObjectFifo broadcast_fifo(const std::string& name, const std::string& tensor, ElemType type, const Herd& h,
                          const Device& d, int64_t object_elems, std::vector<AccessPattern> ddr);
}  // namespace detail

}  // namespace tessera::npusim
