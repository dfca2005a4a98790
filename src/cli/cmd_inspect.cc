// `tessera inspect`: the spec, the architecture features and the kernels a model needs.
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/weights.h"
#include "model/default_model.h"

namespace tessera::cli {

namespace {

struct InspectArgs {
  std::string model;
  bool json = false;
};

void run_inspect(const InspectArgs& a) {
  const std::string path = resolve_model_path(a.model);
  Model m = Model::open(path);
  const ModelSpec& s = m.spec();

  std::map<std::string, int64_t> dtype_counts;
  uint64_t bytes = 0;
  int64_t params = 0;
  for (const auto& [name, w] : m.weights()) {
    dtype_counts[dtype_name(w.info.dtype)]++;
    bytes += w.info.nbytes;
    params += w.info.numel();
  }
  const auto features = spec_features(s);
  const auto kernels = spec_kernels(s);

  if (a.json) {
    nlohmann::json j;
    j["path"] = path;
    j["format"] = m.format();
    j["spec"] = s.to_json();
    for (const auto& [k, v] : features) j["features"][k] = v;
    for (const auto& k : kernels) j["kernels"].push_back({{"kernel", k.kernel}, {"role", k.role}, {"shape", k.shape}});
    j["tensors"] = {{"count", m.weights().size()}, {"bytes", bytes}, {"parameters", params}, {"dtypes", dtype_counts}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model      {}\nformat     {}\n", path, m.format());
  fmt::print("parameters {:.1f} M in {} tensors, {:.1f} MiB on disk (", double(params) / 1e6, m.weights().size(),
             double(bytes) / (1 << 20));
  bool first = true;
  for (const auto& [d, n] : dtype_counts) {
    fmt::print("{}{} {}", first ? "" : ", ", n, d);
    first = false;
  }
  fmt::print(")\n\nspec\n");
  fmt::print("  hidden {}  intermediate {}  layers {}  heads {}  kv heads {}  head_dim {}  vocab {}  context {}\n",
             s.hidden, s.intermediate, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.vocab, s.max_position);
  fmt::print("\nfeatures\n");
  for (const auto& [k, v] : features) fmt::print("  {:<16} {}\n", k, v);
  fmt::print("\nkernels (per layer unless named otherwise; T = tokens)\n");
  for (const auto& k : kernels) fmt::print("  {:<13} {:<14} {}\n", k.kernel, k.role, k.shape);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a model's spec, architecture features and the kernels it needs");
  cmd->add_option("model", args->model, "Hugging Face directory or .gguf file (default: SmolLM2-135M-Instruct)");
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace tessera::cli
