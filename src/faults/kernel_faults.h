// The porting faults that live in a kernel, applied to any target through its kernel
// interceptor (StagedRunner::set_kernel_interceptor): each either calls the target's own
// kernel with what a buggy port would hand it (no bias, another layer's cache rows, a stale
// row) and fixes up its output the buggy way (permuted rows, a bias after RoPE), or computes
// the stage its own wrong way in fp32 (faulty_kernels.h) where the bug is inside the kernel.
#pragma once
#include <memory>

#include "targets/staged_runner.h"

namespace tessera {

// The interceptor for the kernel faults among `faults` (names from porting_faults()), or
// nullptr when there are none. `model` must outlive it; `threads` for the faults' own kernels.
std::shared_ptr<KernelInterceptor> kernel_fault_interceptor(const Model& model, const FaultSet& faults, int threads);

}  // namespace tessera
