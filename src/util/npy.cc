#include "util/npy.h"

#include <fstream>
#include <regex>

#include "util/error.h"

namespace tessera {

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ", ";
    n *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // "(3, 4)" but "(3,)"
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic(6) + version(2) + header length(2) + header, padded to 64 bytes, ending in '\n'
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot write {}", path);
  const uint16_t hlen = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(char(hlen & 0xff));
  out.put(char(hlen >> 8));
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(float)));
  if (!out) fail("failed writing {}", path);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path);
  char magic[8];
  in.read(magic, 8);
  if (!in || std::string(magic, 6) != "\x93NUMPY") fail("{}: not a .npy file", path);
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  if (hlen > (1u << 20)) fail("{}: header too large", path);
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  if (header.find("'descr': '<f4'") == std::string::npos) fail("{}: only little-endian float32 is read", path);
  if (header.find("'fortran_order': False") == std::string::npos) fail("{}: only C order is read", path);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('shape': \(([0-9, ]*)\))"))) fail("{}: no shape", path);
  NpyArray a;
  int64_t n = 1;
  const std::string dims = m[1];
  static const std::regex number(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it) {
    a.shape.push_back(std::stoll(it->str()));
    n *= a.shape.back();
  }
  a.data.resize(size_t(n));
  in.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * sizeof(float)));
  if (in.gcount() != std::streamsize(n * sizeof(float))) fail("{}: truncated data", path);
  return a;
}

}  // namespace tessera
