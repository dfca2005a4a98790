// Captures named probes of a forward pass into a map (rows x cols each).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "oracle/oracle.h"
#include "util/error.h"

namespace tessera {

struct Capture {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, int64_t> cols;
  ProbeFn fn(std::function<bool(const std::string&)> want) {
    return [this, want](const std::string& name, const float* data, int64_t rows, int64_t c) {
      if (!want(name)) return;
      auto& v = values[name];
      v.insert(v.end(), data, data + rows * c);  // appended: decode steps extend prefill rows
      cols[name] = c;
    };
  }
  const std::vector<float>& at(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end()) fail("internal: probe '{}' was not captured", name);
    return it->second;
  }
};

}  // namespace tessera
