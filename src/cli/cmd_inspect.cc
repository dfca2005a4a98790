// `tessera inspect`: the spec, the architecture features and the kernels a model needs.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <vector>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/weights.h"
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

// "0-2, 5, 7-9": sorted layer indices as ranges.
std::string layer_ranges(const std::vector<int64_t>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ", ", i == j ? fmt::format("{}", layers[i])
                                                               : fmt::format("{}-{}", layers[i], layers[j]));
    i = j + 1;
  }
  return out;
}

// Each tensor role ("model.layers.N.mlp.down_proj.weight") with the storage types its tensors
// have and, per type, the layers that have it: a mixed quantization (Q4_K_M keeps some
// layers' attn_v and ffn_down at Q6_K) reads at a glance.
std::map<std::string, std::map<std::string, std::vector<int64_t>>> types_by_role(const Model& m) {
  std::map<std::string, std::map<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, w] : m.weights()) {
    std::string role = name;
    int64_t layer = -1;
    const std::string prefix = "model.layers.";
    if (name.starts_with(prefix)) {
      const size_t dot = name.find('.', prefix.size());
      layer = std::stoll(name.substr(prefix.size(), dot - prefix.size()));
      role = prefix + "N" + name.substr(dot);
    }
    out[role][dtype_name(w.info.dtype)].push_back(layer);
  }
  for (auto& [role, types] : out)
    for (auto& [t, layers] : types) std::sort(layers.begin(), layers.end());
  return out;
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
    if (model) {
      j["tensors"] = {{"count", model->weights().size()}, {"bytes", bytes}, {"parameters", params}, {"dtypes", dtype_counts}};
      for (const auto& [name, w] : model->weights()) j["tensors"]["types"][name] = dtype_name(w.info.dtype);
    }
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
    fmt::print("\nweight types (per tensor role; N = layer)\n");
    for (const auto& [role, types] : types_by_role(*model)) {
      std::string line;
      for (const auto& [t, layers] : types) {
        line += line.empty() ? "" : "; ";
        line += t;
        if (layers.front() >= 0 && types.size() > 1) line += fmt::format(" (layers {})", layer_ranges(layers));
      }
      fmt::print("  {:<48} {}\n", role, line);
    }
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
