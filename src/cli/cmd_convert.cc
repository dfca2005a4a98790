// `tessera convert`: a model written as a BF16 GGUF that llama.cpp loads (see convert/gguf_export.h).
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "convert/gguf_export.h"
#include "model/weights.h"
#include "model/default_model.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct ConvertArgs {
  std::string model;
  std::string to = "gguf";
  std::string dtype = "bf16";
  std::string out;
  std::string tokenizer_pre;
  bool quiet = false;
};

}  // namespace

void add_convert_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Write a model's weights as a BF16 GGUF that llama.cpp loads (q/k rows permuted for its\n"
      "RoPE, llama3 scaling as rope_freqs.weight, the model's tokenizer as tokenizer.ggml.*).");
  auto a = std::make_shared<ConvertArgs>();
  cmd->add_option("model", a->model, "Hugging Face directory or GGUF file (default: the default model)");
  cmd->add_option("--to", a->to, "Output format: gguf")->default_val("gguf");
  cmd->add_option("--dtype", a->dtype, "Weight type: bf16 (1-D tensors stay F32)")->default_val("bf16");
  cmd->add_option("--out", a->out, "Output .gguf file");
  cmd->add_option("--tokenizer-pre", a->tokenizer_pre,
                  "tokenizer.ggml.pre for a tokenizer.json whose pre-tokenizer is not recognised "
                  "(llama-bpe, qwen2, smollm, gpt-2)");
  cmd->add_flag("--quiet", a->quiet, "No progress on stderr (shown only on a terminal anyway)");
  cmd->callback([a] {
    if (a->to != "gguf") fail("convert: unsupported --to '{}' (supported: gguf)", a->to);
    if (a->dtype != "bf16" && a->dtype != "BF16")
      fail("convert: unsupported --dtype '{}' (supported: bf16)", a->dtype);
    if (a->out.empty()) fail("convert needs --out FILE.gguf");
    // Names both llama.cpp and tessera's GGUF tokenizer loader know.
    const std::string& pre = a->tokenizer_pre;
    if (!pre.empty() && pre != "llama-bpe" && pre != "qwen2" && pre != "smollm" && pre != "gpt-2" && pre != "default")
      fail("convert: unsupported --tokenizer-pre '{}' (supported: llama-bpe, qwen2, smollm, gpt-2, default)", pre);
    const Model model = Model::open(resolve_model_path(a->model));
    GgufExportOptions opts;
    opts.out_path = a->out;
    opts.tokenizer_pre = a->tokenizer_pre;
    int last = -1;
    ExportProgress progress;
    if (!a->quiet && isatty(fileno(stderr))) {
      progress = [&last](uint64_t done, uint64_t total) {
        const int pct = total ? int(done * 100 / total) : 100;
        if (pct == last) return;
        last = pct;
        fmt::print(stderr, "\rconvert: {:3d}% of {:.2f} GiB", pct, double(total) / double(1 << 30));
        if (done == total) fmt::print(stderr, "\n");
        std::fflush(stderr);
      };
    }
    const GgufExportResult r = export_gguf_bf16(model, opts, progress);
    fmt::print("wrote {}: {} ({}), {} tensors, {:.1f} MiB of BF16/F32 data, tokenizer pre '{}'\n", a->out,
               arch_name(model.spec().arch), model.format(), r.tensors, double(r.tensor_bytes) / (1 << 20),
               r.tokenizer_pre);
  });
}

}  // namespace tessera::cli
