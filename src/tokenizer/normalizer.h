// Normalizers of tokenizer.json that tessera runs: NFC (Qwen) and sequences of it. Others
// are refused when the file is loaded, so that no text is silently tokenized differently.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Normalizer {
 public:
  enum class Step { NFC };
  void add(Step s) { steps_.push_back(s); }
  bool empty() const { return steps_.empty(); }
  std::string run(std::string_view text) const;

 private:
  std::vector<Step> steps_;
};

}  // namespace tessera
