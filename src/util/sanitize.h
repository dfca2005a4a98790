// Hot numeric loops under AddressSanitizer: one check of each whole range a call reads or
// writes, instead of one per value. Under ASan the sanitized suite spent most of its time in
// a few inner loops (the oracle's dot, the dtype conversions, npusim's dot); marked
// TS_RANGE_CHECKED and calling check_range on entry, they still report any access to a
// poisoned byte (out of bounds, freed), as ASan's own report, but they run unchecked inside.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TS_RANGE_CHECKED __attribute__((no_sanitize_address))
#else
#define TS_RANGE_CHECKED
#endif

namespace tessera {

// Reports (and stops, as ASan does) if any byte of [p, p + bytes) may not be accessed.
inline void check_range(const void* p, size_t bytes, bool is_write) {
#if defined(__SANITIZE_ADDRESS__)
  if (bytes == 0) return;
  if (void* bad = __asan_region_is_poisoned(const_cast<void*>(p), bytes))
    __asan_report_error(__builtin_return_address(0), __builtin_frame_address(0), __builtin_frame_address(0), bad,
                        is_write ? 1 : 0, 1);
#else
  (void)p;
  (void)bytes;
  (void)is_write;
#endif
}

}  // namespace tessera
