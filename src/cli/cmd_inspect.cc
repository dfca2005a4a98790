// `tessera inspect`: the spec, the architecture features and the kernels a model needs.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/weights.h"
#include "model/default_model.h"
#include "pipeline/op_table.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct InspectArgs {
  std::string model;
  bool json = false;
};

// A bare config.json describes the architecture without weights.
ModelSpec spec_from_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read {}", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
  try {
    return spec_from_hf_config(j);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

void run_inspect(const InspectArgs& a) {
  const std::string path = resolve_model_path(a.model);
  const bool config_only = path.ends_with(".json") && std::filesystem::is_regular_file(path);
  std::optional<Model> model;
  if (!config_only) model = Model::open(path);
  const ModelSpec s = config_only ? spec_from_config_file(path) : model->spec();

  std::map<std::string, int64_t> dtype_counts;
  uint64_t bytes = 0;
  int64_t params = 0;
  if (model)
    for (const auto& [name, w] : model->weights()) {
      dtype_counts[dtype_name(w.info.dtype)]++;
      bytes += w.info.nbytes;
      params += w.info.numel();
    }
  const auto features = spec_features(s);
  const auto kernels = op_table_needs(s);  // the op table's rows: what phase 1 gates

  if (a.json) {
    nlohmann::json j;
    j["path"] = path;
    j["format"] = model ? model->format() : "config.json";
    j["spec"] = s.to_json();
    for (const auto& [k, v] : features) j["features"][k] = v;
    for (const auto& k : kernels) j["kernels"].push_back({{"kernel", k.kernel}, {"role", k.role}, {"shape", k.shape}});
    if (model)
      j["tensors"] = {{"count", model->weights().size()}, {"bytes", bytes}, {"parameters", params}, {"dtypes", dtype_counts}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model      {}\nformat     {}\n", path, model ? model->format() : "config.json (no weights)");
  if (model) {
    fmt::print("parameters {:.1f} M in {} tensors, {:.1f} MiB on disk (", double(params) / 1e6,
               model->weights().size(), double(bytes) / (1 << 20));
    bool first = true;
    for (const auto& [d, n] : dtype_counts) {
      fmt::print("{}{} {}", first ? "" : ", ", n, d);
      first = false;
    }
    fmt::print(")\n");
  }
  fmt::print("\nspec\n");
  fmt::print("  hidden {}  intermediate {}  layers {}  heads {}  kv heads {}  head_dim {}  vocab {}  context {}\n",
             s.hidden, s.intermediate, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.vocab, s.max_position);
  fmt::print("\nfeatures\n");
  for (const auto& [k, v] : features) fmt::print("  {:<16} {}\n", k, v);
  fmt::print("\nkernels (per layer unless named otherwise; T = tokens)\n");
  for (const auto& k : kernels) fmt::print("  {:<16} {:<16} {}\n", k.kernel, k.role, k.shape);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a model's spec, architecture features and the kernels it needs");
  cmd->add_option("model", args->model, "Hugging Face directory, .gguf file, or a bare config.json (default: SmolLM2-135M-Instruct)");
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace tessera::cli
