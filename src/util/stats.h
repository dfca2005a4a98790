// Small statistics over repeated measurements.
#pragma once
#include <algorithm>
#include <vector>

namespace tessera {

// The median (the mean of the middle two for an even count); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace tessera
