// GGUF v2/v3 reader: metadata and tensor directory, memory-mapped, every field bounds
// checked against the file size (a corrupt file gives one line, never a crash).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "io/tensor.h"

namespace tessera {

class MappedFile;

// A metadata value. Arrays of strings and of numbers are kept whole (tokenizer vocabularies).
struct GgufValue {
  enum class Type { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };
  Type type = Type::U32;
  std::variant<uint64_t, int64_t, double, bool, std::string> scalar;
  Type elem_type = Type::U32;               // for ARRAY
  std::vector<std::string> strings;         // ARRAY of STRING
  std::vector<double> numbers;              // ARRAY of numeric (and bool) types

  bool is_array() const { return type == Type::ARRAY; }
  int64_t as_int() const;          // throws if not an integer scalar
  double as_double() const;        // numeric scalars
  bool as_bool() const;
  const std::string& as_string() const;
};

const char* gguf_type_name(GgufValue::Type t);  // "u32", "string", "array", ...

// Tensor data alignment when a file has no general.alignment key (the GGUF spec's default).
inline constexpr uint64_t kGgufDefaultAlignment = 32;

// GGML tensor type ids: the one for each dtype tessera reads, the dtype for an id (nullopt
// when tessera cannot read it), and ggml's name for any id it knows ("q4_K"; else nullptr).
uint32_t ggml_type_id(DType t);
std::optional<DType> dtype_from_ggml(uint32_t type);
const char* ggml_type_name(uint32_t type);

class GgufFile {
 public:
  // Throws tessera::Error naming the problem: wrong magic, unsupported version, counts
  // larger than the file can hold, a string or array running past the end, an unknown
  // value type, a tensor whose data runs past the end. A tensor of a type tessera does not
  // read is listed in unsupported(), not refused here.
  static GgufFile open(const std::string& path);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const;

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue& get(const std::string& key) const;  // throws naming the missing key
  const GgufValue* find(const std::string& key) const;
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }

  // Tensors with GGUF names ("blk.0.attn_q.weight") and shapes outermost first.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Tensors of a type tessera does not read (left out of tensors()): the model loader refuses
  // them by name after it has checked the architecture, so that an unsupported architecture
  // is always what the user hears first.
  struct UnsupportedTensor {
    std::string name;
    uint32_t type = 0;  // ggml's type id
  };
  const std::vector<UnsupportedTensor>& unsupported() const { return unsupported_; }
  // "tensor 'x' has tensor type 16 (iq2_xxs), which tessera does not read (it reads f32, ...)"
  static std::string describe(const UnsupportedTensor& t);

 private:
  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  std::map<std::string, GgufValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::vector<UnsupportedTensor> unsupported_;
};

}  // namespace tessera
