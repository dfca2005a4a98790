// Debug skill unsynced-handover: a producer on the device computes right, yet the host code
// that consumes its output sees something else (the buffer was never synced to the host).
#include <fmt/format.h>

#include "oracle/ops.h"
#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> unsynced_handover(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t H = s.hidden, KV = s.kv_dim(), T = a.T;
  const std::string name = "decode steps: the attention reads q other than the q its producer left (a hand-over never "
                           "synced to the host)";
  if (T < 3) return {not_applicable(name, "unsynced-handover", "the prompt is too short for a prefill and two decode steps")};
  // Layer 0 over the prompt as a prefill and two decode steps, the second one probed: the q
  // after RoPE (what the producer left) and the attention's output, and the cache as written.
  struct Step {
    std::vector<float> q, attn, consistent;
  };
  auto run = [&](const std::set<Stage>& on_oracle) {
    std::unique_ptr<StagedRunner> t = ctx.fresh_target();
    t->set_oracle_stages(on_oracle);
    t->reset();
    const std::vector<float>& in = a.probe.at("embed");
    std::vector<float> h(in.begin(), in.begin() + (T - 2) * H);
    t->forward_layers(h.data(), T - 2, 1);
    Step st;
    for (int64_t row = T - 2; row < T; ++row) {
      std::vector<float> x(in.begin() + row * H, in.begin() + (row + 1) * H);
      t->forward_layers(x.data(), 1, 1, [&](const std::string& n, const float* d, int64_t rows, int64_t cols) {
        if (n == "layers.0.q") st.q.assign(d, d + rows * cols);
        if (n == "layers.0.attn") st.attn.assign(d, d + rows * cols);
      }, ProbeLevel::All);
    }
    // The attention the producer's q asks for, over the cache as the target holds it.
    std::vector<float> k(size_t(T * KV)), v(size_t(T * KV));
    t->kv_read(0, 0, T, k.data(), v.data());
    st.consistent.resize(st.attn.size());
    oracle::attention(st.q.data(), 1, T - 1, k.data(), v.data(), s, st.consistent.data(), 0);
    return std::pair{std::move(st), t->handover(Stage::Rope, Stage::Attention, 1)};
  };
  const auto [device, where] = run({});
  const auto [host, unused] = run({Stage::QkvProj, Stage::Rope});  // q computed by the host: its own hand-over
  (void)unused;
  const double match = gates::threshold("diagnose.match_nmse_max"), sep = gates::threshold("diagnose.separation_min");
  const double off = nmse(device.consistent, device.attn), off_host = nmse(host.consistent, host.attn);
  Hypothesis h{name + (where.empty() ? "" : ": " + where), "unsynced-handover", "", ""};
  h.evidence = fmt::format("NMSE of the attention against the attention of the producer's own q: {:.3g} with q from the "
                           "device, {:.3g} with q computed by the host",
                           off, off_host);
  h.verdict = off_host <= match && off >= sep * match ? "confirmed" : "ruled out";
  return {h};
}

}  // namespace tessera
