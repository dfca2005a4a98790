#include "io/quant_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>

#include "util/error.h"

namespace tessera {

namespace {

// llama.cpp's LLAMA_FTYPE_MOSTLY_* (include/llama.h).
constexpr uint32_t kFtypeQ4_0 = 2, kFtypeQ4_1 = 3, kFtypeQ8_0 = 7, kFtypeQ5_0 = 8, kFtypeQ5_1 = 9,
                   kFtypeQ2_K = 10, kFtypeQ3_K_S = 11, kFtypeQ4_K_S = 14, kFtypeQ4_K_M = 15,
                   kFtypeQ5_K_S = 16, kFtypeQ5_K_M = 17, kFtypeQ6_K = 18;

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The part of a name llama.cpp's tensor categories look at (tensor_get_category).
enum class Category { Output, TokenEmbd, AttnV, FfnDown, Other };

Category category(const std::string& n) {
  if (n == "output.weight") return Category::Output;
  if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Category::TokenEmbd;
  // attn_qkv and attn_kv_b count as attn_v (category_is_attn_v); tessera's architectures
  // have neither, but the rule is the same.
  if (n.find("attn_qkv.weight") != std::string::npos || n.find("attn_kv_b.weight") != std::string::npos ||
      n.find("attn_v.weight") != std::string::npos)
    return Category::AttnV;
  if (n.find("attn_k.weight") != std::string::npos || n.find("attn_q.weight") != std::string::npos ||
      n.find("attn_output.weight") != std::string::npos || n.find("ffn_up") != std::string::npos ||
      n.find("ffn_gate") != std::string::npos)
    return Category::Other;
  if (n.find("ffn_down") != std::string::npos) return Category::FfnDown;
  return Category::Other;
}

// tensor_allows_quantization, for the tensors tessera's architectures have: 2-D, a name
// ending in "weight", not a norm.
bool quantizable(const PlanTensor& t) {
  if (t.shape.size() < 2) return false;
  const std::string& n = t.name;
  if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
  if (n.find("_norm.weight") != std::string::npos) return false;
  if (n.find("ffn_gate_inp.weight") != std::string::npos) return false;
  return true;
}

// The first and last eighth of the layers, and every third layer between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int layer_of(const std::string& n) {
  int layer = -1;
  std::sscanf(n.c_str(), "blk.%d.", &layer);
  return layer;
}

}  // namespace

const std::vector<QuantScheme>& quant_schemes() {
  static const std::vector<QuantScheme> schemes = {
      {"q8_0", DType::Q8_0, false, kFtypeQ8_0},     {"q4_0", DType::Q4_0, false, kFtypeQ4_0},
      {"q4_1", DType::Q4_1, false, kFtypeQ4_1},     {"q5_0", DType::Q5_0, false, kFtypeQ5_0},
      {"q5_1", DType::Q5_1, false, kFtypeQ5_1},     {"q2_k", DType::Q2_K, false, kFtypeQ2_K},
      {"q3_k", DType::Q3_K, false, kFtypeQ3_K_S},   {"q4_k", DType::Q4_K, false, kFtypeQ4_K_S},
      {"q5_k", DType::Q5_K, false, kFtypeQ5_K_S},   {"q6_k", DType::Q6_K, false, kFtypeQ6_K},
      {"q4_k_m", DType::Q4_K, true, kFtypeQ4_K_M},  {"q5_k_m", DType::Q5_K, true, kFtypeQ5_K_M},
  };
  return schemes;
}

const QuantScheme* find_quant_scheme(const std::string& name) {
  const std::string n = lower(name);
  for (const QuantScheme& s : quant_schemes())
    if (s.name == n) return &s;
  return nullptr;
}

std::string quant_scheme_names() {
  std::string out;
  for (const QuantScheme& s : quant_schemes()) out += (out.empty() ? "" : ", ") + s.name;
  return out;
}

std::vector<PlanChoice> plan_quant_types(const QuantScheme& scheme, const std::vector<PlanTensor>& tensors,
                                         int64_t n_layers) {
  std::vector<PlanChoice> out(tensors.size());
  // llama.cpp's counters run in its loader's order: tensors outside the blocks first, then
  // block by block, by name within each (llama_model_loader::weight_name_comparer).
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
    if (la != lb) return la < lb;
    return tensors[a].name < tensors[b].name;
  });
  int64_t n_attn_v = 0;
  bool tied = true;  // until an output.weight is seen
  for (const PlanTensor& t : tensors) {
    const Category c = category(t.name);
    if (c == Category::AttnV) ++n_attn_v;
    if (c == Category::Output) tied = false;
  }
  int64_t i_attn_v = 0, i_ffn_down = 0;

  for (size_t idx : order) {
    const PlanTensor& t = tensors[idx];
    PlanChoice& choice = out[idx];
    if (!quantizable(t)) {
      choice.type = t.unquantized;
      continue;
    }
    choice.quantized = true;
    const int64_t cols = t.shape.back();
    DType type = scheme.base;
    if (scheme.mixed) {
      const Category c = category(t.name);
      if (c == Category::Output || (tied && c == Category::TokenEmbd)) {
        const char* what = c == Category::Output ? "output projection" : "embedding tied to the output";
        if (cols % dtype_block_values(type) != 0) {
          type = DType::Q8_0;
          choice.note = fmt::format("{}: Q8_0 ({} values a row, not a multiple of {})", what, cols,
                                    dtype_block_values(scheme.base));
        } else if (type != DType::Q8_0) {
          type = DType::Q6_K;
          choice.note = fmt::format("{}: Q6_K", what);
        }
      } else if (c == Category::AttnV) {
        if (use_more_bits(i_attn_v, n_attn_v)) {
          type = DType::Q6_K;
          choice.note = fmt::format("attn_v {} of {}: Q6_K (more bits)", i_attn_v, n_attn_v);
        }
        ++i_attn_v;
      } else if (c == Category::FfnDown) {
        if (use_more_bits(i_ffn_down, n_layers)) {
          type = DType::Q6_K;
          choice.note = fmt::format("ffn_down {} of {}: Q6_K (more bits)", i_ffn_down, n_layers);
        }
        ++i_ffn_down;
      }
    }
    // tensor_type_fallback: a row that does not split into the type's blocks.
    if (cols % dtype_block_values(type) != 0) {
      const DType wanted = type;
      switch (type) {
        case DType::Q2_K:
        case DType::Q3_K: type = DType::Q4_0; break;
        case DType::Q4_K: type = DType::Q5_0; break;
        case DType::Q5_K: type = DType::Q5_1; break;
        case DType::Q6_K: type = DType::Q8_0; break;
        default: break;  // a 32-value type: nothing smaller to fall back to
      }
      if (cols % dtype_block_values(type) != 0) type = DType::F16;
      const std::string why = fmt::format("{} -> {}: {} values a row, not a multiple of {}", dtype_name(wanted),
                                          dtype_name(type), cols, dtype_block_values(wanted));
      choice.note = choice.note.empty() ? why : choice.note + "; " + why;
    }
    choice.type = type;
  }
  return out;
}

}  // namespace tessera
