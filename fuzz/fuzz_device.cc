// An npusim device profile (devices/*.json, or a user's file given to --device).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "targets/npusim/device.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(fuzz::as_view(data, size), nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    npusim::Device d = npusim::parse_device(j, "fuzz.json");
    (void)d;
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
