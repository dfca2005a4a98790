// A safetensors file (8-byte header length, JSON header, data) and, for inputs that start
// with '{', a sharded model directory's model.safetensors.index.json.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = fuzz::as_view(data, size);
  try {
    SafetensorsFile f = SafetensorsFile::open(fuzz::write_temp("model.safetensors", bytes).string());
    for (const TensorInfo& t : f.tensors()) (void)t.shape_str();
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  if (size > 0 && bytes[0] == '{') {
    // A shard index beside a valid config.json, the model directory Model::open reads.
    static const std::filesystem::path dir = [] {
      std::filesystem::path d = fuzz::temp_dir() / "sharded";
      std::filesystem::create_directories(d);
      std::ofstream(d / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2})";
      return d;
    }();
    std::ofstream(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    try {
      Model m = Model::open(dir.string());
    } catch (const Error&) {
    } catch (const nlohmann::json::exception&) {
    }
  }
  return 0;
}
