// A deployment directory's state.json as `tessera deploy` (resume), `run` and `bench` open it.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "pipeline/deployment.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = fuzz::temp_dir() / "deployment";
    std::filesystem::create_directories(d);
    return d;
  }();
  std::ofstream(dir / "state.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    Deployment d = Deployment::open_existing(dir);
    for (const PhaseDef& p : phase_defs()) {
      (void)d.phase_status(p.id);
      (void)d.phase_record(p.id);
    }
    d.write_phase_timing();
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  try {  // a resume: the identity must match the one asked
    Deployment d = Deployment::open_for_deploy(dir, {{"model_path", "m.gguf"}, {"target", "cpu"}});
    (void)d.identity();
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
