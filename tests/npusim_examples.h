// Small example mappings that prove the engine and shape the calibration points: an
// element-wise add over columns. Not part of the kernel set (that lives in mappings_*.h).
#pragma once
#include <cstdint>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

class Engine;

// Z = X + Y over n bf16 elements on `columns` workers (tile (c, first compute row)), each
// taking a contiguous n / columns segment in objects of `chunk` elements; X, Y filled and Z
// drained through the column's shim and memory tile. resident_x marks X resident (only
// correct if X never changes between calls: the stale-buffer example).
Launch example_add_launch(int64_t n, int columns, int64_t chunk, const Device& device, bool resident_x = false,
                          int depth = 2);
// y[N] = W[N, K] . x[K] (W row-major, a Linear weight) on `columns` workers, each taking
// N / columns rows in objects of `rows_per_object` rows; x is broadcast to every worker
// through the first column's memory tile and held for the whole launch; y is bf16.
Launch example_gemv_launch(int64_t N, int64_t K, int columns, int64_t rows_per_object, const Device& device);
// A two-worker pipeline through a worker-to-worker fifo: worker "double" (tile (0, first
// compute row)) reads X and pushes 2x into link L (`depth` slots); worker "add_one" on the
// tile above takes L `hold` objects at a time and drains 2x + 1 to Z. n bf16 elements in
// objects of `chunk`.
Launch example_pipeline_launch(int64_t n, int64_t chunk, int depth, int hold, const Device& device);
// Two workers passing `objects` objects each way through links AB and BA (depth 1). With
// `consume_first` each worker waits for the other's object before producing its own: a
// cycle the engine reports as a deadlock; otherwise A produces first and it completes.
Launch example_ring_launch(int64_t objects, bool consume_first, const Device& device);
// Registers "example_add_bf16" (z = bf16(x + y)), "example_gemv_bf16" (fp32 dot over 32
// lanes) and the pipeline's and ring's kernels.
void register_example_kernels(Engine& engine);

}  // namespace tessera::npusim
