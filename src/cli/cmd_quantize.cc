// `tessera quantize`: a model written as a quantized GGUF that tessera and llama.cpp load
// (see convert/gguf_quantize.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "convert/gguf_quantize.h"
#include "model/weights.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct QuantizeArgs {
  std::string model;
  std::string to;
  std::string out;
  int threads = 0;
  bool quiet = false;
};

// An interrupted run (Ctrl-C, kill) removes the file being written: the output path only
// ever appears whole (it is renamed into place at the end).
char g_temp_path[4096];

void remove_temp_and_die(int sig) {
  if (g_temp_path[0]) ::unlink(g_temp_path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

struct TempFileGuard {
  explicit TempFileGuard(const std::string& path) {
    std::snprintf(g_temp_path, sizeof g_temp_path, "%s", path.c_str());
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, remove_temp_and_die);
  }
  ~TempFileGuard() {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    g_temp_path[0] = '\0';
  }
};

double mib(uint64_t b) { return double(b) / double(1 << 20); }

}  // namespace

void add_quantize_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Write a model as a quantized GGUF that tessera and llama.cpp load: q8_0, q4_0, q4_1, q5_0,\n"
      "q5_1 (bytes as the gguf package's quantizers), q2_k..q6_k (llama.cpp's reference\n"
      "quantizers, no importance matrix) on every 2-D weight, or llama.cpp's q4_k_m / q5_k_m mixes.");
  auto a = std::make_shared<QuantizeArgs>();
  cmd->add_option("model", a->model,
                  "Hugging Face directory (safetensors) or an F32/F16/BF16 GGUF (e.g. from tessera convert)");
  cmd->add_option("--to", a->to, "Type: " + quant_scheme_names());
  cmd->add_option("--out", a->out, "Output .gguf file");
  cmd->add_option("--threads", a->threads, "Threads quantizing (default: all cores)");
  cmd->add_flag("--quiet", a->quiet, "No per-tensor progress on stderr");
  cmd->callback([a] {
    if (a->model.empty()) fail("quantize needs MODEL (a Hugging Face directory or an F32/F16/BF16 GGUF)");
    if (a->to.empty()) fail("quantize needs --to TYPE (one of: {})", quant_scheme_names());
    const QuantScheme* scheme = find_quant_scheme(a->to);
    if (!scheme) fail("quantize: unknown type '{}' (accepted: {})", a->to, quant_scheme_names());
    if (a->out.empty()) fail("quantize needs --out FILE.gguf");
    if (a->threads < 0) fail("quantize: --threads must be positive, got {}", a->threads);
    const int threads = a->threads > 0 ? a->threads : int(std::max(1u, std::thread::hardware_concurrency()));
    if (!std::filesystem::exists(a->model)) fail("{}: no such file or directory", a->model);

    const Model model = Model::open(a->model);
    QuantizeOptions opts;
    opts.out_path = a->out;
    opts.threads = threads;
    std::map<std::string, int> counts;
    opts.on_tensor = [&](size_t i, size_t n, const QuantizedTensor& q, uint64_t bytes) {
      counts[dtype_name(q.choice.type)]++;
      if (a->quiet) return;
      const Weight* w = q.tensor.canonical.empty() ? nullptr : &model.get(q.tensor.canonical);
      const DType from = w ? w->info.dtype : DType::F32;
      int64_t numel = 1;
      for (int64_t d : q.tensor.shape) numel *= d;
      fmt::print(stderr, "quantize: [{:>{}}/{}] {:<28} [{}] {} -> {}, {:.2f} -> {:.2f} MiB{}\n", i + 1,
                 fmt::format("{}", n).size(), n, q.tensor.gguf_name, fmt::join(q.tensor.shape, ", "),
                 dtype_name(from), dtype_name(q.choice.type), mib(dtype_bytes(from, numel)), mib(bytes),
                 q.choice.note.empty() ? "" : " (" + q.choice.note + ")");
      std::fflush(stderr);
    };
    const TempFileGuard guard(export_temp_path(a->out));
    const QuantizeResult r = quantize_model(model, *scheme, opts);
    std::string mix;
    for (const auto& [t, c] : counts) mix += fmt::format("{}{} {}", mix.empty() ? "" : ", ", c, t);
    int64_t params = 0;
    for (const auto& [name, w] : model.weights()) params += w.info.numel();
    fmt::print("wrote {}: {} (general.file_type {}), {} tensors ({}), {:.1f} MiB of tensor data, {:.2f} bits per weight\n",
               a->out, scheme->name, r.file_type, r.tensors, mix, mib(r.bytes), 8.0 * double(r.bytes) / double(params));
  });
}

}  // namespace tessera::cli
