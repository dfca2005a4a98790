#include "targets/target.h"

#include <algorithm>

#include "util/error.h"

namespace tessera {

void ModelRunner::select_sequence(int seq) {
  if (seq != 0) fail("{} target: holds one sequence only (sequence {} asked for)", target(), seq);
}

void ModelRunner::decode_batch(std::span<const int> seqs, std::span<const int32_t> ids, std::vector<float>& logits) {
  if (seqs.size() != ids.size() || seqs.empty())
    fail("{} target: a decode step of {} sequences with {} tokens", target(), seqs.size(), ids.size());
  const int64_t V = spec().vocab;
  const int keep = selected_sequence();
  logits.resize(seqs.size() * size_t(V));
  for (size_t i = 0; i < seqs.size(); ++i) {
    select_sequence(seqs[i]);
    const std::vector<float> one = forward(ids.subspan(i, 1), false);
    std::copy(one.begin(), one.end(), logits.begin() + std::ptrdiff_t(i * size_t(V)));
  }
  select_sequence(keep);
}

}  // namespace tessera
