// GGUF v3 writer: metadata in the order added, then a tensor directory, then tensor data
// streamed to disk in declaration order (never held in memory). Used by tests to craft
// files and by benchmarks to write models for llama.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/tensor.h"

namespace tessera {

class GgufWriter {
 public:
  explicit GgufWriter(const std::string& path);
  // A writer destroyed before close() (an exception unwound past it) removes its partial file.
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata; keys must be unique. "general.alignment" (a u32 power of two) also sets the
  // alignment the writer uses; it defaults to 32.
  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f64(const std::string& key, double v);
  void add_array(const std::string& key, const std::vector<std::string>& v);
  // A numeric (or bool) array stored as `elem_type`; each value must be exactly
  // representable in it (integral and in range for integer types, 0 or 1 for bool).
  void add_array(const std::string& key, GgufValue::Type elem_type, const std::vector<double>& v);
  // Any value as read by GgufFile (to copy metadata from one file to another).
  void add(const std::string& key, const GgufValue& v);

  // Declares a tensor; `shape` is outermost first (it is stored reversed, as GGUF wants).
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  // Declares a tensor of any ggml type id with a caller-given size, unchecked: for crafting
  // files that readers must refuse.
  void add_tensor_raw(const std::string& name, uint32_t ggml_type,
                      const std::vector<int64_t>& shape, uint64_t nbytes);

  // Writes the next declared tensor's bytes (in declaration order, size checked). The
  // header goes to disk on the first call; no metadata or tensors may be added after it.
  void write(const std::string& name, const void* data, uint64_t nbytes);
  // The same in pieces (a large tensor converted row by row): each call appends to the
  // tensor being written; it is done when its parts add up to its size.
  void write_part(const std::string& name, const void* data, uint64_t nbytes);
  // Writes the header if no tensor was written, checks every tensor was, closes the file.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
