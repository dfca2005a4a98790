// Generic perturbations (issue 16): a stage's output made wrong in a named, sized way, from
// outside the target (an OutputTap, targets/staged_runner.h). They measure what the gates
// can see, on any target, without a line in any kernel: `--perturb STAGE:KIND:SIZE[:SCOPE]`.
//
// Kinds (SIZE is a plain number; what it scales is the kind's):
//   gain     every value x (1 + SIZE)
//   offset   every value + SIZE x the output's RMS
//   noise    every value + SIZE x the output's RMS x a fixed pseudo-random N(0, 1)
//   element  one element per row (its index moves with the row) + SIZE x the output's RMS
//   tail     the last SIZE fraction of each row's columns (at least one) set to 0 (a short loop bound)
//   permute  the first SIZE fraction of each row's columns (at least one pair) swapped in adjacent
//            pairs (a layout slip)
//   stale    (1 - SIZE) x this call's output + SIZE x the previous same-shaped call's (a buffer not refreshed)
//   shift    (1 - SIZE) x row t + SIZE x row t-1 within the call (positions off by one)
//   int8     each row's blocks of SIZE values rounded to int8 steps of the block's max|x| / 127
//            (how llama.cpp's Q8_0 / Q8_K activations round a matmul's input; SIZE 32 or 256)
// Scopes (any number): decode (steps of one token only), prefill (steps of more), layer=N,
// fused (only where the target runs the stage as a fused kernel), out=NAME (one output of a
// stage: q, k, v, gate, up).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "targets/staged_runner.h"

namespace tessera {

struct Perturbation {
  Stage stage = Stage::Count;
  std::string kind;
  double size = 0;
  bool decode_only = false, prefill_only = false, fused_only = false;
  std::optional<int64_t> layer;
  std::string output;  // "" : every output of the stage
  std::string spec;    // as given
};
const std::vector<std::string>& perturbation_kinds();
// Parses "STAGE:KIND:SIZE[:SCOPE...]"; throws naming what is wrong.
Perturbation parse_perturbation(const std::string& spec);
// A tap applying every perturbation to the outputs it matches; nullptr when `specs` is empty.
std::shared_ptr<OutputTap> perturbation_tap(const std::vector<std::string>& specs);

}  // namespace tessera
