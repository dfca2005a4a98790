// config.json (and generation_config.json's EOS ids) to ModelSpec.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/spec.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(fuzz::as_view(data, size), nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    ModelSpec spec = spec_from_hf_config(j);
    (void)spec_features(spec);
    (void)spec_to_hf_config(spec).dump();
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  try {
    std::vector<int64_t> ids;
    add_eos_ids(j, ids);  // generation_config.json
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
