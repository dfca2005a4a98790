// safetensors reader (single file), memory-mapped; every header entry is checked against
// the file before any byte is used. The writer is used by `tessera synth`.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/tensor.h"

namespace tessera {

class SafetensorsFile {
 public:
  // Throws tessera::Error with one line naming the file and the problem: truncated file,
  // header length past the end, header not JSON, unknown dtype, offsets past the end or
  // inconsistent with shape x dtype, overlapping tensors.
  static SafetensorsFile open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Streams a safetensors file: declare every tensor first, then write their bytes in
// declaration order. Only F32, F16 and BF16 may be written.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, const std::vector<Entry>& entries,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // Append the bytes of the next declared tensor (in order); sizes are checked.
  void write(const std::string& name, const void* data, uint64_t nbytes);
  // The same in pieces, so that a large tensor need not be held in memory whole: each call
  // appends to the tensor being written; it is done when its parts add up to its size.
  void write_part(const std::string& name, const void* data, uint64_t nbytes);
  void close();  // checks that every declared tensor was written

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
