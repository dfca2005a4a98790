// The faults a deployment can be made to commit on purpose (`tessera deploy --inject NAME`),
// each a known porting failure (../shared/reference/porting-pitfalls.md) that the gates must
// catch. The porting faults here are applied to any target from outside it (faults/
// injection.h): kernels, Generator and Tokenizer carry no fault hooks. A target adds the
// faults of its own mapping (TargetDef::faults: npusim's buffer and DMA bugs).
#pragma once
#include <string>
#include <vector>

#include "targets/target.h"

namespace tessera {

// The faults every target takes, in the order `--help` lists them: the kernels' (one stage
// computed a wrong way), the runtime's (double-bos: the prompt path; eos-first-only: the
// stop set) and the evaluator's (oracle-fallback, nondeterministic: only phase 7 sees them).
const std::vector<FaultInfo>& porting_faults();
// What `target` accepts: its own faults, then porting_faults(); throws for an unknown target.
const std::vector<FaultInfo>& target_faults(const std::string& target);
// One of them by name; throws naming them all.
const FaultInfo& target_fault_info(const std::string& target, const std::string& name);
// Whether `name` is one of the target's own (passed to it) rather than applied from outside.
bool is_targets_own_fault(const std::string& target, const std::string& name);

}  // namespace tessera
