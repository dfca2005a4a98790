// The test binary runs on the kernel path TESSERA_ISA names, as the CLI does (cpu::set_isa at
// start): `TESSERA_ISA=AVX2 ctest ...` runs every kernel, gate and deploy test on that path.
#include <gtest/gtest.h>

#include "targets/cpu/kernels.h"

namespace {

class IsaFromEnvironment : public ::testing::Environment {
 public:
  // Throws (failing the whole run, naming the ISAs this CPU has) on an unknown or unsupported name.
  void SetUp() override { tessera::cpu::set_isa(tessera::cpu::isa_from_environment()); }
};

const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new IsaFromEnvironment);

}  // namespace
