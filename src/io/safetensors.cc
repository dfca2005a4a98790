#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/mapped_file.h"

namespace tessera {

// Tensor bytes are used in place from the mapping, so the host must match the file.
static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

namespace {

using nlohmann::json;

std::optional<DType> dtype_from_name(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  return std::nullopt;
}

// dtypes of the safetensors spec that tessera does not read; anything else is unknown.
bool is_known_safetensors_dtype(const std::string& s) {
  static const std::set<std::string> known = {
      "BOOL", "U8",  "I8", "I16",     "U16",     "I32",     "U32",     "I64",    "U64",
      "F64",  "C64", "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3", "F8_E5M2", "F8_E8M0"};
  return known.count(s) != 0;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A non-negative JSON integer, or nullopt (negative, fractional, not a number).
std::optional<uint64_t> json_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return uint64_t(j.get<int64_t>());
  return std::nullopt;
}

// One header entry, checked against the data region; `begin` is relative to that region.
struct ParsedEntry {
  TensorInfo info;
  uint64_t begin = 0;
};

ParsedEntry parse_entry(const std::string& path, const std::string& name, const json& e,
                        uint64_t data_size) {
  if (!e.is_object()) fail("{}: header entry '{}' is not a JSON object", path, name);
  auto dt = e.find("dtype");
  auto sh = e.find("shape");
  auto off = e.find("data_offsets");
  if (dt == e.end() || !dt->is_string()) fail("{}: tensor '{}' has no string 'dtype'", path, name);
  if (sh == e.end() || !sh->is_array()) fail("{}: tensor '{}' has no 'shape' array", path, name);
  if (off == e.end() || !off->is_array() || off->size() != 2) {
    fail("{}: tensor '{}' has no 'data_offsets' pair [begin, end]", path, name);
  }

  ParsedEntry out;
  TensorInfo& t = out.info;
  t.name = name;
  const std::string dtype = dt->get<std::string>();
  auto parsed = dtype_from_name(dtype);
  if (!parsed) {
    if (is_known_safetensors_dtype(dtype)) {
      fail("{}: tensor '{}' has dtype {}, which tessera does not support (F32, F16, BF16)", path,
           name, dtype);
    }
    fail("{}: tensor '{}' has unknown dtype '{}'", path, name, dtype);
  }
  t.dtype = *parsed;

  int64_t numel = 1;
  for (const json& d : *sh) {
    auto v = json_u64(d);
    if (!v) {
      fail("{}: tensor '{}' has {} dimension {}", path, name,
           d.is_number_integer() ? "negative" : "non-integer", d.dump());
    }
    if (*v > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, int64_t(*v), &numel)) {
      fail("{}: tensor '{}' shape {} overflows the element count", path, name, sh->dump());
    }
    t.shape.push_back(int64_t(*v));
  }

  auto begin = json_u64((*off)[0]);
  auto end = json_u64((*off)[1]);
  if (!begin || !end) {
    fail("{}: tensor '{}' data_offsets {} are not non-negative integers", path, name, off->dump());
  }
  if (*begin > *end) {
    fail("{}: tensor '{}' data_offsets begin {} > end {}", path, name, *begin, *end);
  }
  if (*end > data_size) {
    fail("{}: tensor '{}' data_offsets end {} is past the end of the data region ({} bytes)", path,
         name, *end, data_size);
  }
  t.nbytes = *end - *begin;
  uint64_t expected;
  if (__builtin_mul_overflow(uint64_t(numel), uint64_t(dtype_block_bytes(t.dtype)), &expected) ||
      t.nbytes != expected) {
    fail("{}: tensor '{}' holds {} bytes but shape {} of {} needs {}", path, name, t.nbytes,
         sh->dump(), dtype, uint64_t(numel) * uint64_t(dtype_block_bytes(t.dtype)));
  }
  out.begin = *begin;
  return out;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<const MappedFile> file = MappedFile::open(path);
  const uint64_t size = file->size();
  if (size < 8) {
    fail("{}: file is {} bytes, too short for a safetensors header (needs at least 8)", path, size);
  }
  const uint64_t header_len = read_u64_le(file->data());
  if (header_len > size - 8) {
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, header_len, size);
  }
  const char* hp = reinterpret_cast<const char*>(file->data() + 8);
  json header;
  try {
    header = json::parse(hp, hp + header_len);
  } catch (const json::parse_error& e) {
    fail("{}: header is not valid JSON (parse error at byte {} of {})", path,
         std::min<uint64_t>(e.byte, header_len), header_len);
  } catch (const json::exception&) {  // e.g. a number literal too large for a double
    fail("{}: header is not valid JSON (a value is out of range)", path);
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", path);

  SafetensorsFile st;
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  std::vector<ParsedEntry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ is not a JSON object", path);
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) fail("{}: __metadata__ value for '{}' is not a string", path, k);
        st.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value, data_size));
  }

  // File order; then any tensor starting before its predecessor ends overlaps it.
  // Empty tensors own no bytes, so they cannot overlap anything.
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.info.name < b.info.name;
  });
  const ParsedEntry* prev = nullptr;
  for (const ParsedEntry& e : entries) {
    if (e.info.nbytes == 0) continue;
    if (prev && e.begin < prev->begin + prev->info.nbytes) {
      fail("{}: tensors '{}' and '{}' overlap in the data region", path, prev->info.name,
           e.info.name);
    }
    prev = &e;
  }
  for (ParsedEntry& e : entries) {
    e.info.data = file->data() + data_start + e.begin;
    e.info.file = file;
    st.tensors_.push_back(std::move(e.info));
  }
  return st;
}

// ---------------------------------------------------------------------------------------

struct SafetensorsWriter::Impl {
  std::string path;
  std::vector<Entry> entries;
  std::vector<uint64_t> sizes;
  size_t next = 0;       // tensor being written
  uint64_t written = 0;  // bytes of it written so far
  std::FILE* f = nullptr;

  // A writer abandoned before close() (an exception unwound past it) removes its partial
  // file, so no truncated safetensors is left behind to be picked up later.
  ~Impl() {
    if (f) {
      std::fclose(f);
      std::remove(path.c_str());
    }
  }

  void put(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f) != n) {
      fail("{}: write failed: {}", path, std::strerror(errno));
    }
  }
};

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Entry>& entries,
                                     const std::map<std::string, std::string>& metadata)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->entries = entries;

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16) {
      fail("{}: cannot write tensor '{}' as {} (safetensors takes F32, F16, BF16)", path, e.name,
           dtype_name(e.dtype));
    }
    if (e.name == "__metadata__" || !names.insert(e.name).second) {
      fail("{}: tensor name '{}' is reserved or declared twice", path, e.name);
    }
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
        fail("{}: tensor '{}' has an invalid shape", path, e.name);
      }
    }
    const uint64_t nbytes = dtype_bytes(e.dtype, numel);
    uint64_t end;
    if (__builtin_add_overflow(offset, nbytes, &end)) fail("{}: tensors too large", path);
    header[e.name] = {
        {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    impl_->sizes.push_back(nbytes);
    offset = end;
  }

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data region 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  impl_->f = std::fopen(path.c_str(), "wb");
  if (!impl_->f) fail("cannot create {}: {}", path, std::strerror(errno));
  impl_->put(len, 8);
  impl_->put(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const std::string& name, const void* data, uint64_t nbytes) {
  const Impl& w = *impl_;
  // Only the whole-tensor checks here; write_part checks the order.
  if (w.f && w.next < w.entries.size() && name == w.entries[w.next].name) {
    if (w.written != 0) fail("{}: tensor '{}' was begun with write_part", w.path, name);
    if (nbytes != w.sizes[w.next]) {
      fail("{}: tensor '{}' is {} bytes, expected {}", w.path, name, nbytes, w.sizes[w.next]);
    }
  }
  write_part(name, data, nbytes);
}

void SafetensorsWriter::write_part(const std::string& name, const void* data, uint64_t nbytes) {
  Impl& w = *impl_;
  if (!w.f) fail("{}: write of '{}' after close", w.path, name);
  if (w.next >= w.entries.size()) {
    fail("{}: write of '{}' but all {} declared tensors are written", w.path, name,
         w.entries.size());
  }
  const Entry& e = w.entries[w.next];
  if (name != e.name) {
    fail("{}: write of '{}' but '{}' is next (tensors are written in declaration order)", w.path,
         name, e.name);
  }
  if (nbytes > w.sizes[w.next] - w.written) {
    fail("{}: tensor '{}' is {} bytes; {} more after {} is too many", w.path, name, w.sizes[w.next],
         nbytes, w.written);
  }
  w.put(data, nbytes);
  w.written += nbytes;
  if (w.written == w.sizes[w.next]) {
    ++w.next;
    w.written = 0;
  }
}

void SafetensorsWriter::close() {
  Impl& w = *impl_;
  if (!w.f) return;
  if (w.next != w.entries.size()) {
    fail("{}: closed before tensor '{}' was written", w.path, w.entries[w.next].name);
  }
  std::FILE* f = w.f;
  w.f = nullptr;
  if (std::fclose(f) != 0) {
    const int e = errno;
    std::remove(w.path.c_str());
    fail("{}: write failed: {}", w.path, std::strerror(e));
  }
}

}  // namespace tessera
