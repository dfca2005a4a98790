// A read-only memory mapping of a whole file: weights are mapped, never copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera {

class MappedFile {
 public:
  // Throws tessera::Error naming the path if it cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside [p, p + n) (a range reaching the end of the file: its last
  // page too) from this process's memory (they stay in the file and come back if read
  // again): for bytes a reader has copied into its own layout.
  void release(const uint8_t* p, uint64_t n) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tessera
