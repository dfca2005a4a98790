// Minimal fork-join parallelism: split [0, n) into contiguous chunks over worker threads.
#pragma once
#include <cstdint>
#include <functional>

namespace tessera {

// Number of threads to use: $TESSERA_THREADS if set, else the hardware's.
int default_threads();

// Calls fn(begin, end) on disjoint chunks covering [0, n), using up to `threads` threads
// (the calling thread included). Exceptions from workers are rethrown on the caller.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tessera
