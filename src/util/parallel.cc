#include "util/parallel.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

int default_threads() {
  if (const char* env = std::getenv("TESSERA_THREADS"); env && *env) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t workers = std::clamp<int64_t>(threads, 1, n);
  if (workers == 1) {
    fn(0, n);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t w) {
    const int64_t begin = n * w / workers, end = n * (w + 1) / workers;
    try {
      fn(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(workers - 1));
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace tessera
