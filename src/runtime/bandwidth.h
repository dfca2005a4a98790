// Host memory read bandwidth, the roof that decode speed on the CPU is held against
// (decode reads every weight once per token).
#pragma once
#include <cstdint>

namespace tessera {

// Sequential read bandwidth in GB/s (1e9 bytes), measured with `threads` threads (<= 0: the
// default thread count) each summing its own contiguous slice of a `bytes` buffer, which
// should be much larger than the last-level cache. The buffer is written first (each thread
// touches its own slice, so its pages are local), then read `repeats` times; the best
// repeat is reported. Throws tessera::Error when the buffer cannot be allocated.
double measure_read_bandwidth_gbs(int threads, int64_t bytes = int64_t(1) << 30, int repeats = 3);

// Writes and reads a buffer of `bytes` (default 256 MiB, several times any last-level cache)
// so that nothing measured afterwards is served from the caches.
void evict_caches(int64_t bytes = int64_t(256) << 20);

}  // namespace tessera
