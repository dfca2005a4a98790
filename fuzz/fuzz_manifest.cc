// A deployment's manifest.json as `tessera audit` checks it (eval/audit.h manifest_problems):
// the hashes of plan.json, report.json and the model's files, against a fixed deployment
// directory whose files the seeds hash correctly (fuzz/corpus/manifest/).
#include <nlohmann/json.hpp>

#include "eval/audit.h"
#include "fuzz_util.h"
#include "pipeline/deployment.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = fuzz::temp_dir() / "deployment";
    std::filesystem::create_directories(d);
    const std::string model = fuzz::write_temp("model.gguf", "GGUF model bytes\n").string();
    const nlohmann::json state = {{"format", "tessera-deployment/1"},
                                  {"identity", {{"model_path", model}, {"target", "cpu"}}},
                                  {"phases", nlohmann::json::object()}};
    std::ofstream(d / "state.json") << state.dump(2) << "\n";
    std::ofstream(d / "plan.json") << "{}\n";
    std::ofstream(d / "report.json") << "{}\n";
    return d;
  }();
  static const Deployment dep = Deployment::open_existing(dir);
  const nlohmann::json manifest = nlohmann::json::parse(data, data + size, nullptr, false);
  if (manifest.is_discarded()) return 0;
  try {
    (void)manifest_problems(manifest, dep);
  } catch (const Error&) {
  }
  return 0;
}
