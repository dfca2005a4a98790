// `tessera bench MODEL_OR_DIR --target cpu`: prefill and decode throughput, and the
// machine's read bandwidth measured in the same run, so decode can be held against its
// roof (bandwidth / bytes read per token). A benchmark, not a test: it reports, it does
// not judge. bench/llama_cpp.sh runs llama.cpp beside it and prints the ratios.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "pipeline/executor.h"
#include "runtime/bandwidth.h"
#include "targets/cpu/kernels.h"
#include "targets/registry.h"
#include "util/error.h"
#include "util/stats.h"
#include "util/parallel.h"

namespace tessera::cli {

namespace {

struct BenchArgs {
  std::string model;
  std::string target;
  std::vector<int> prompt_lens;
  int decode_tokens = 32;
  std::vector<int> batches;  // decode steps of several sequences at once (continuous batching)
  int repeats = 3;
  int threads = 0;
  bool json = false;
  bool no_bandwidth = false;
  bool profile = false;
  std::string plan;
  std::string device;
  std::string isa;
};

// 512 MiB: far beyond any cache, and short enough (~20 ms a pass) to take after every repeat.
constexpr int64_t kPairedBandwidthBytes = int64_t(512) << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A target whose figures are predicted (a modelled NPU): its timing model's prefill and decode
// figures, then the simulator's own wall time per functional decode step.
void bench_predicted(const BenchArgs& a, StagedRunner& runner, nlohmann::json& out, const std::vector<int>& lens,
                     const std::vector<int32_t>& ids) {
  const ModelSpec& s = runner.spec();
  auto say = [&](const std::string& line) {
    if (!a.json) fmt::print(stderr, "{}\n", line);
  };
  const nlohmann::json first = runner.predict_pass(true, 0);
  out["device"] = first["device"];
  out["plan"] = first["plan"];
  say(fmt::format("  predicted by the timing model of device {} under plan {} (not a measurement: {} models a device)",
                  first["device"].get<std::string>(), first["plan"].get<std::string>(), runner.target()));
  std::vector<int> prefill_lens = {2048};
  for (int L : lens)
    if (L != 2048) prefill_lens.push_back(L);
  for (int L : prefill_lens) {
    if (L > s.max_position) continue;
    const nlohmann::json p = runner.predict_pass(false, L);
    const double us = p["us"].get<double>();
    const int64_t dispatches = p["npu_dispatches"].get<int64_t>();
    out["predicted_prefill"].push_back(
        {{"prompt_len", L}, {"ms", us / 1e3}, {"tokens_per_s", L / (us / 1e6)}, {"npu_dispatches", dispatches}});
    say(fmt::format("  prefill {:>4} tokens: {:9.2f} ms predicted ({:.0f} tok/s; {} NPU dispatches)", L, us / 1e3,
                    L / (us / 1e6), dispatches));
  }
  for (int C : lens) {
    const nlohmann::json p = runner.predict_pass(true, C);
    const double us = p["us"].get<double>();
    const int64_t dispatches = p["npu_dispatches"].get<int64_t>();
    out["predicted_decode"].push_back(
        {{"context", C}, {"ms_per_token", us / 1e3}, {"tokens_per_s", 1e6 / us}, {"npu_dispatches", dispatches}});
    say(fmt::format("  decode at context {:>4}: {:7.3f} ms/token predicted ({:.1f} tok/s; {} NPU dispatches)", C, us / 1e3,
                    1e6 / us, dispatches));
  }
  // The simulator's own speed: wall time of one functional decode step (every launch run
  // tile by tile on this host), after a short prompt.
  runner.reset();
  runner.forward(std::span(ids).first(8), false);
  std::vector<double> wall;
  for (int r = 0; r < a.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    runner.forward(std::span(ids).subspan(size_t(8 + r), 1), false);
    wall.push_back(seconds_since(t0));
  }
  out["simulator_decode_step_s"] = median(wall);
  say(fmt::format("  simulator speed: one functional decode step takes {:.3f} s of wall time here (median of {})",
                  median(wall), wall.size()));
  if (a.json) fmt::print("{}\n", out.dump(2));
}

void run_bench(const BenchArgs& a) {
  if (a.repeats < 1) fail("--repeats must be >= 1, got {}", a.repeats);
  if (a.decode_tokens < 1) fail("--decode-tokens must be >= 1, got {}", a.decode_tokens);
  if (!a.isa.empty()) cpu::set_isa(a.isa);  // throws naming the ISAs this CPU has
  ExecutorOptions eo;
  eo.target = a.target;
  eo.threads = a.threads;
  eo.profile = a.profile;
  eo.plan_name = a.plan;
  eo.device = a.device;
  Executor ex = open_executor(a.model, eo);
  ModelRunner& runner = *ex.runner;
  const ModelSpec& s = runner.spec();
  std::vector<int> lens = a.prompt_lens.empty() ? std::vector<int>{128, 512} : a.prompt_lens;
  for (int L : lens)
    if (L < 1 || L + a.decode_tokens >= s.max_position) fail("--prompt-len {} does not fit the model's context of {}", L, s.max_position);
  const int threads = a.threads > 0 ? a.threads : default_threads();

  // Token ids drawn uniformly (fixed seed): throughput does not depend on which ids.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(s.vocab - 1));
  const int max_len = *std::max_element(lens.begin(), lens.end());
  std::vector<int32_t> ids(size_t(max_len + a.decode_tokens));
  for (int32_t& id : ids) id = pick(rng);

  auto say = [&](const std::string& line) {
    if (!a.json) fmt::print(stderr, "{}\n", line);
  };
  say(fmt::format("tessera bench: {} on {} ({} threads)", ex.source, ex.description, threads));
  nlohmann::json out = {{"model", ex.model->path()}, {"source", ex.source}, {"target", runner.target()}, {"threads", threads},
                        {"repeats", a.repeats}};
  // Every target but the oracle is a StagedRunner: what bench needs of it is asked there.
  auto* staged = dynamic_cast<StagedRunner*>(&runner);
  if (staged) out["isa"] = staged->isa();
  const bool predicted = staged && !staged->predict_pass(true, 0).is_null();
  if (predicted) return bench_predicted(a, *staged, out, lens, ids);

  // Warm-up: the first touch of mapped weights and buffer growth are not throughput.
  runner.reset();
  runner.forward(std::span(ids).first(size_t(std::min(max_len, 64))), false);

  for (int L : lens) {
    std::vector<double> tps;
    for (int r = 0; r < a.repeats; ++r) {
      runner.reset();
      const auto t0 = std::chrono::steady_clock::now();
      runner.forward(std::span(ids).first(size_t(L)), false);
      tps.push_back(L / seconds_since(t0));
    }
    out["prefill"].push_back({{"prompt_len", L}, {"tokens_per_s", median(tps)}, {"samples", tps}});
    say(fmt::format("  prefill {:>4} tokens: {:8.1f} tok/s", L, median(tps)));
  }
  auto report_profile = [&](const std::string& what, double tokens) {
    if (!a.profile || !staged) return;
    double total = 0;
    for (const auto& [stage, sec] : staged->stage_seconds()) total += sec;
    std::string line = fmt::format("    profile {} (us/token):", what);
    for (const auto& [stage, sec] : staged->stage_seconds()) {
      out["profile"][what][stage] = sec / tokens;
      line += fmt::format(" {} {:.0f} ({:.0f}%);", stage, 1e6 * sec / tokens, 100 * sec / total);
    }
    say(line);
    staged->clear_profile();
  };
  if (staged) staged->clear_profile();
  // The machine's read bandwidth drifts by tens of percent within minutes on a shared VM, so
  // each decode repeat is paired with a bandwidth measurement taken right after it, and the
  // roofline fraction is the median of the per-repeat fractions (same run, same minute).
  // A measured target reads every weight once per decode step: its bandwidth roof applies.
  const bool with_bandwidth = staged && !a.no_bandwidth;
  std::vector<double> all_bw;
  for (int C : lens) {
    std::vector<double> tps, bws, fractions;
    // Decode reads every weight once, plus the keys and values of the C positions before it.
    const int64_t bytes = staged ? staged->weight_bytes_per_token() + int64_t(C) * staged->kv_bytes_per_position() : 0;
    for (int r = 0; r < a.repeats; ++r) {
      runner.reset();
      runner.forward(std::span(ids).first(size_t(C)), false);
      const auto t0 = std::chrono::steady_clock::now();
      if (staged) staged->clear_profile();
      for (int i = 0; i < a.decode_tokens; ++i) runner.forward(std::span(ids).subspan(size_t(C + i), 1), false);
      tps.push_back(a.decode_tokens / seconds_since(t0));
      if (with_bandwidth) {
        bws.push_back(measure_read_bandwidth_gbs(threads, kPairedBandwidthBytes, 2));
        fractions.push_back(tps.back() * double(bytes) / (bws.back() * 1e9));
      }
    }
    report_profile(fmt::format("decode@{}", C), a.decode_tokens);
    nlohmann::json d = {{"context", C}, {"tokens_per_s", median(tps)}, {"samples", tps}};
    say(fmt::format("  decode at context {:>4}: {:8.1f} tok/s", C, median(tps)));
    if (with_bandwidth) {
      const std::string key = std::to_string(C);
      d["bandwidth_samples_gbs"] = bws;
      d["roofline_fraction_samples"] = fractions;
      out["bytes_per_token"][key] = bytes;
      out["roofline_tokens_per_s"][key] = median(bws) * 1e9 / double(bytes);
      out["roofline_fraction"][key] = median(fractions);
      all_bw.insert(all_bw.end(), bws.begin(), bws.end());
      say(fmt::format("    {:.1f} MB read per token; read bandwidth right after each repeat {:.1f} GB/s (median of {}); "
                      "roof {:.1f} tok/s; reached {:.0f}% (median of the per-repeat fractions)",
                      bytes / 1e6, median(bws), bws.size(), median(bws) * 1e9 / double(bytes), 100 * median(fractions)));
    }
    out["decode"].push_back(d);
  }
  // Batched decode: B sequences, each prefilled with the context alone, then decode steps
  // that run all B in one pass over the weights (ModelRunner::decode_batch).
  for (int B : a.batches) {
    if (B < 1 || B > runner.max_sequences())
      fail("--batch {}: this target holds 1 to {} sequences", B, runner.max_sequences());
    std::vector<int> seqs(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) seqs[size_t(i)] = i;
    std::vector<float> logits;  // one buffer for every step, as a server keeps it
    for (int C : lens) {
      std::vector<double> tps;
      for (int r = 0; r < a.repeats; ++r) {
        for (int i = 0; i < B; ++i) {
          runner.select_sequence(i);
          runner.reset();
          runner.forward(std::span(ids).first(size_t(C)), false);
        }
        runner.select_sequence(0);
        const auto t0 = std::chrono::steady_clock::now();
        if (staged) staged->clear_profile();
        for (int t = 0; t < a.decode_tokens; ++t) {
          const std::vector<int32_t> step(size_t(B), ids[size_t(C + t)]);
          runner.decode_batch(seqs, step, logits);
        }
        tps.push_back(double(B) * a.decode_tokens / seconds_since(t0));
      }
      report_profile(fmt::format("decode of {} sequences@{}", B, C), int64_t(B) * a.decode_tokens);
      out["decode_batch"].push_back({{"batch", B}, {"context", C}, {"tokens_per_s", median(tps)}, {"samples", tps}});
      say(fmt::format("  decode of {:>2} sequences at context {:>4}: {:8.1f} tok/s in all, {:.1f} per sequence", B, C,
                      median(tps), median(tps) / B));
    }
  }
  if (with_bandwidth) {
    out["read_bandwidth_gbs"] = median(all_bw);
    say(fmt::format("  read bandwidth ({} threads): {:.1f} GB/s (median of {} measurements, range {:.1f}-{:.1f})", threads,
                    median(all_bw), all_bw.size(), *std::min_element(all_bw.begin(), all_bw.end()),
                    *std::max_element(all_bw.begin(), all_bw.end())));
  }
  if (a.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure prefill and decode tokens/s (at 128 and 512 tokens by default) and the machine's read bandwidth");
  cmd->add_option("model", a->model, "A deployment directory, or a Hugging Face directory or .gguf file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("--target", a->target, "For a model: " + target_choices() + " or oracle");
  cmd->add_option("--prompt-len", a->prompt_lens, "Prompt length(s) for prefill, also the decode contexts (default: 128 and 512)");
  cmd->add_option("--decode-tokens", a->decode_tokens, "Tokens timed per decode measurement")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Repeats per figure (the median is reported)")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_option("--batch", a->batches,
                  "Also time decode steps of N sequences at once (continuous batching), each at the prompt length's context")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", a->json, "Print one JSON object instead of the table");
  cmd->add_flag("--no-bandwidth", a->no_bandwidth, "Skip the read-bandwidth measurement");
  cmd->add_option("--plan", a->plan, "For a model: the named plan (cpu: cpu-fused (default), cpu-naive; npusim: baseline (default), naive, merged)");
  cmd->add_option("--device", a->device, "npusim: the device profile (default xdna2)");
  cmd->add_option("--isa", a->isa,
                  "cpu target: force a kernel path, to compare them on one machine (auto, amx, avx512bf16, hwy, or a "
                  "Highway target this CPU has: AVX3, AVX2, SSE4, SCALAR; as cpu::set_isa)");
  cmd->add_flag("--profile", a->profile, "cpu target: also report wall time per stage for decode and each --batch (the last repeat; per token, so a batch divides its step by its rows)");
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace tessera::cli
