// `tessera dump`: run the FP32 oracle and write its probe points as .npy files plus an
// index.json, so that any tool can compare them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/weights.h"
#include "model/default_model.h"
#include "oracle/oracle.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/npy.h"

namespace fs = std::filesystem;

namespace tessera::cli {

namespace {

struct DumpArgs {
  std::string model;
  std::string ids;
  std::string prompt;
  bool prompt_given = false;
  std::string out;
  std::string probes = "layers";
  int threads = 0;
};

// The tokenizer that travels with the model, when it has one: --prompt needs it, and it
// names the top tokens; a dump by --ids works without it.
std::optional<Tokenizer> model_tokenizer(const Model& m, bool required) {
  try {
    return Tokenizer::for_model(m);
  } catch (const Error&) {
    if (required) throw;
    return std::nullopt;
  }
}

void run_dump(const DumpArgs& a) {
  ProbeLevel level;
  if (a.probes == "layers") level = ProbeLevel::Layers;
  else if (a.probes == "all") level = ProbeLevel::All;
  else fail("--probes must be 'layers' or 'all', got '{}'", a.probes);
  if (a.prompt_given == !a.ids.empty()) fail("give exactly one of --prompt TEXT or --ids 1,2,3");
  const std::string path = resolve_model_path(a.model);
  Model model = Model::open(path);
  const std::optional<Tokenizer> tok = model_tokenizer(model, a.prompt_given);
  std::vector<int32_t> ids;
  if (a.prompt_given) {
    if (a.prompt.empty()) fail("the prompt is empty");
    ids = tok->encode_prompt(a.prompt);
  } else {
    ids = parse_ids(a.ids);
  }
  Oracle oracle(model, a.threads);

  fs::create_directories(a.out);
  nlohmann::json index;
  index["model"] = path;
  index["ids"] = ids;
  index["n_layers"] = model.spec().n_layers;
  index["probes"] = a.probes;
  index["tensors"] = nlohmann::json::object();
  std::vector<float> last_logits;
  std::vector<std::pair<std::string, double>> layer_rms;
  auto probe = [&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
    const std::string file = name + ".npy";
    write_npy((fs::path(a.out) / file).string(), data, {rows, cols});
    index["tensors"][name] = {{"file", file}, {"shape", {rows, cols}}};
    if (name == "logits") last_logits.assign(data + (rows - 1) * cols, data + rows * cols);
    if (name.ends_with(".out")) {
      double ss = 0;
      for (int64_t i = 0; i < rows * cols; ++i) ss += double(data[i]) * data[i];
      layer_rms.emplace_back(name, std::sqrt(ss / double(rows * cols)));
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  oracle.forward(ids, /*all_logits=*/true, probe, level);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream(fs::path(a.out) / "index.json") << index.dump(2) << "\n";

  fmt::print("oracle forward: {} tokens through {} layers in {:.2f} s ({} probe files in {})\n", ids.size(),
             model.spec().n_layers, secs, index["tensors"].size(), a.out);
  for (const auto& [name, rms] : layer_rms) fmt::print("  {:<14} rms {:.4f}\n", name, rms);
  std::vector<int64_t> order(last_logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = std::min<size_t>(5, order.size());
  std::partial_sort(order.begin(), order.begin() + long(k), order.end(),
                    [&](int64_t x, int64_t y) { return last_logits[size_t(x)] > last_logits[size_t(y)]; });
  fmt::print("next token after the last position (top {}):\n", k);
  for (size_t i = 0; i < k; ++i) {
    const int64_t id = order[i];
    fmt::print("  {:>7}  logit {:8.4f}  {}\n", id, last_logits[size_t(id)],
               tok && id < tok->vocab_size() ? nlohmann::json(tok->token_string(int32_t(id))).dump() : "");
  }
}

}  // namespace

void add_dump_command(CLI::App& app) {
  auto args = std::make_shared<DumpArgs>();
  CLI::App* cmd = app.add_subcommand(
      "dump", "Run the FP32 oracle on a prompt or token ids and write every layer's hidden state, the final norm and the "
              "logits as .npy files with an index.json");
  cmd->add_option("model", args->model, "Hugging Face directory or .gguf file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("--prompt", args->prompt, "Text, tokenized with the model's tokenizer (BOS by the family's rule)")
      ->each([args](const std::string&) { args->prompt_given = true; });
  cmd->add_option("--ids", args->ids, "Comma-separated token ids, e.g. 1,9690,42");
  cmd->add_option("--out", args->out, "Output directory")->required();
  cmd->add_option("--probes", args->probes, "'layers' (hidden after each layer, final norm, logits) or 'all' "
                                            "(every kernel output of every layer)");
  cmd->add_option("--threads", args->threads, "Worker threads (default: all cores)");
  cmd->callback([args] { run_dump(*args); });
}

}  // namespace tessera::cli
