// Integer fields of the JSON documents tessera reads back (plans, state, phase records).
// nlohmann's get<int64_t>() converts a JSON float by a plain cast, which is undefined
// behaviour once the float is out of range (the fuzzers found 2.8e34 in plan.json, 6.1e60 in
// config.json and 1.5e23 in an npusim plan's GEMV tiles); a reader of an integer field takes
// JSON integers only, in the range it can hold, else an Error that names the field.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string_view>

#include "util/error.h"

namespace tessera {

// v as an integer in [lo, hi]; `what` names it in the error ("npusim plan: GEMV tile 'rb'").
inline int64_t json_integer(const nlohmann::json& v, std::string_view what,
                            int64_t lo = std::numeric_limits<int64_t>::min(),
                            int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (!v.is_number_integer()) fail("{} must be an integer, not a JSON {}", what, v.type_name());
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("{} is out of range ({})", what, v.get<uint64_t>());
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) fail("{} must be in [{}, {}], not {}", what, lo, hi, i);
  return i;
}

// An int-sized field: in [lo, hi] within int's range.
inline int json_int(const nlohmann::json& v, std::string_view what, int lo = std::numeric_limits<int>::min(),
                    int hi = std::numeric_limits<int>::max()) {
  return int(json_integer(v, what, lo, hi));
}

// obj[key] as json_integer, or `fallback` when obj is not an object or has no such key.
inline int64_t json_integer_or(const nlohmann::json& obj, const char* key, std::string_view what, int64_t fallback,
                               int64_t lo = std::numeric_limits<int64_t>::min(),
                               int64_t hi = std::numeric_limits<int64_t>::max()) {
  return obj.is_object() && obj.contains(key) ? json_integer(obj[key], what, lo, hi) : fallback;
}

}  // namespace tessera
