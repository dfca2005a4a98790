// How a deployment's injected faults are applied: each from outside what it corrupts. A
// runner gets the target's own faults through TargetOptions and the porting faults through
// its kernel interceptor (kernel_faults.h); the runtime's two are applied where the pipeline
// hands ids to the model (the prompt path) and decides when generation stops (the stop set).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "targets/staged_runner.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

// A runner of `target` (targets/registry.h) committing `faults` (names from
// target_faults(target); throws naming them for any other).
std::unique_ptr<StagedRunner> make_runner_with_faults(const std::string& target, const Model& model, TargetOptions options,
                                          const FaultSet& faults);

// The ids the runtime hands the model for a prompt the tokenizer encoded as `ids`
// (double-bos: a second BOS before the first, as a runtime that adds one again would).
std::vector<int32_t> runtime_prompt_ids(const FaultSet& faults, const Tokenizer& tok, std::vector<int32_t> ids);

// What generation stops on (runtime/generate.h stop_ids; eos-first-only: the tokenizer's
// eos_token alone).
std::vector<int32_t> runtime_stop_ids(const FaultSet& faults, const Tokenizer& tok, const ModelSpec& spec);

}  // namespace tessera
