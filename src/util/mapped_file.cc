#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace tessera {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail("{} is a directory, expected a file", path);
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = uint64_t(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("cannot map {}: {}", path, std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

void MappedFile::release(const uint8_t* p, uint64_t n) const {
  if (!data_ || p < data_ || p + n > data_ + size_) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  // Pages wholly inside the range; the file's last page counts as whole (the mapping past
  // the end of the file holds nothing else).
  const uint64_t begin = (uint64_t(p - data_) + page - 1) / page * page;
  const uint64_t end = p + n == data_ + size_ ? (size_ + page - 1) / page * page : uint64_t(p + n - data_) / page * page;
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_ + begin), end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace tessera
