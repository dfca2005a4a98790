#include "faults/catalogue.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "targets/registry.h"
#include "util/error.h"

namespace tessera {

// Each fault names the stage it corrupts (what phase 2's bisect must name) and the first
// phase whose gate must catch it. Faults that live in one kernel are phase 1's to catch;
// a fault that is right on the first call and wrong after (stale-kv) needs phase 2's
// prefill-then-decode run.
const std::vector<FaultInfo>& porting_faults() {
  static const std::vector<FaultInfo> faults = {
      {"rope-interleaved", "rope", 1,
       "RoPE pairs (x[2i], x[2i+1]) (GPT-J style) instead of Hugging Face's half-split (x[i], x[i+d/2])"},
      {"rope-scaling-prefill-only", "rope", 1,
       "llama3 frequency scaling applied in prefill but not in decode (single-token steps use unscaled frequencies)"},
      {"drop-qkv-bias", "qkv_proj", 1, "the q/k/v projection biases (Qwen2) are ignored"},
      {"qk-norm-after-rope", "rope", 1, "Qwen3's per-head q/k RMSNorm applied after RoPE instead of before"},
      {"gqa-modulo", "attention", 1, "query head h reads kv head h % n_kv instead of h / (n_heads / n_kv)"},
      {"attn-scale-hidden", "attention", 1,
       "attention scaled by (hidden / n_heads) ** -0.5 instead of head_dim ** -0.5 (differs when head_dim is decoupled, Qwen3)"},
      {"stale-kv", "kv_write", 2,
       "decode steps write a stale row (the previous step's keys and values) into the KV cache: right on the first call, wrong after"},
      {"bf16-accumulate", "gemm", 1, "GEMM/GEMV accumulate in bf16 instead of fp32"},
      {"fused-qkv-swap", "qkv_proj", 1,
       "the fused q|k|v kernel writes the keys into v and the values into k (plans that fuse the projections: the cpu's; "
       "from cpu-naive, phase 4's gate (the op table on the rewritten plan) catches the merge rewrite and reverts it)"},
      // One more per porting-pitfalls.md row (the debug skills must name each).
      {"qk-rows-permuted", "qkv_proj", 1,
       "q and k come out with each head's rows in the GGUF llama order (pairs interleaved): a loader that forgot to "
       "undo the permutation"},
      {"rope-scaling-missing", "rope", 1, "llama3 RoPE frequency scaling not applied at all (prefill and decode)"},
      {"qkv-bias-after-rope", "qkv_proj", 1, "the q and k biases (Qwen2) added after RoPE instead of in the projection"},
      {"qk-norm-whole-projection", "rope", 1,
       "Qwen3's q/k RMSNorm taken over each token's whole projection instead of per head"},
      {"attn-scale-no-sqrt", "attention", 1, "attention scores scaled by 1 / head_dim instead of head_dim ** -0.5"},
      {"gqa-head0", "attention", 1, "every query head reads kv head 0 (the kv-head offset missing)"},
      {"lm-head-untied", "lm_head", 1,
       "a tied model's LM head taken as a freshly initialised matrix instead of the embedding"},
      {"mask-off-by-one", "attention", 1,
       "the causal mask hides each row's own position: the first row has no key left (0/0, NaN)"},
      {"softmax-unshifted", "attention", 1,
       "the attention softmax takes exp(s) without subtracting the row max: right while scores stay small, inf / inf "
       "= NaN once one passes 88.7 (exp's fp32 range)"},
      {"kv-layer-aliased", "kv_write", 1,
       "every layer's keys and values stored in (and read from) layer 0's cache rows: a prefill in one call reads "
       "back what it just wrote; phase 1's rows of a later layer find that layer's cache empty, and a prompt "
       "prefilled in chunks and decode read another layer's keys"},
      // Above the kernels: the prompt path and the stop set (the runtime's).
      {"double-bos", "prompt", 0,
       "prompts get a second BOS before the first (a runtime adding BOS to ids the tokenizer already started "
       "with): every phase runs on ids the model was never trained on"},
      {"eos-first-only", "generate", 6,
       "generation stops only on the tokenizer's eos_token, not on every end-of-sequence id the checkpoint declares "
       "(instruct models stop on several): it never stops after an end-of-turn token"},
      // Only the evaluator (phase 7, `tessera audit`) can catch these.
      {"oracle-fallback", "silu_mul", 7,
       "SiLU x mul silently computed by the oracle's kernel instead of the target's: every gate passes, only the "
       "per-op counters show it"},
      {"nondeterministic", "lm_head", 7,
       "the least likely token's logit moves by a different few units in the last place on every call: too little for any gate, but "
       "two identical runs differ"},
  };
  return faults;
}

const std::vector<FaultInfo>& target_faults(const std::string& target) {
  static std::mutex mu;
  static std::map<std::string, std::vector<FaultInfo>> lists;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = lists.find(target);
  if (it == lists.end()) {
    std::vector<FaultInfo> all = target_def(target).faults();  // throws naming the targets
    all.insert(all.end(), porting_faults().begin(), porting_faults().end());
    it = lists.emplace(target, std::move(all)).first;
  }
  return it->second;
}

const FaultInfo& target_fault_info(const std::string& target, const std::string& name) {
  const std::vector<FaultInfo>& faults = target_faults(target);
  for (const FaultInfo& f : faults)
    if (f.name == name) return f;
  std::vector<std::string> names;
  for (const FaultInfo& f : faults) names.push_back(f.name);
  fail("unknown fault '{}' for target {}; known faults: {}", name, target, fmt::join(names, ", "));
}

bool is_targets_own_fault(const std::string& target, const std::string& name) {
  const std::vector<FaultInfo>& own = target_def(target).faults();
  return std::any_of(own.begin(), own.end(), [&](const FaultInfo& f) { return f.name == name; });
}

}  // namespace tessera
