// Shared helpers for the test suite: scratch directories, running the tessera binary, and
// quiet deploy options.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <unistd.h>

#include <map>
#include <mutex>

#include "eval/audit.h"
#include "synth/synth.h"

#include "pipeline/phases.h"
#include "targets/npusim/device.h"
#include "util/error.h"

namespace tessera::testing_support {

namespace fs = std::filesystem;

// A fresh directory under the test temp dir, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = fs::path(::testing::TempDir()) /
            ("tessera_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str(const std::string& child = "") const { return child.empty() ? path_.string() : (path_ / child).string(); }

 private:
  fs::path path_;
};

// A unique file path under the test temp dir, ending in `suffix`; the file is removed when
// the object dies.
class TempFile {
 public:
  explicit TempFile(const std::string& suffix) {
    static std::atomic<int> counter{0};
    path_ = (fs::path(::testing::TempDir()) /
             ("tessera_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + suffix))
                .string();
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// open(path) must throw tessera::Error: one line that names the file and contains `needle`.
template <typename Open>
void expect_open_error(Open&& open, const std::string& path, const std::string& needle) {
  try {
    open(path);
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// n bytes that differ from position to position: seed + i * step.
inline std::vector<uint8_t> byte_pattern(size_t n, uint8_t seed, uint8_t step) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * step);
  return v;
}

// The npusim device profile most tests map onto.
inline const npusim::Device& xdna2() {
  static const npusim::Device d = npusim::load_device("xdna2");
  return d;
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `tessera ARGS` with stdout and stderr captured separately.
inline CliResult run_tessera(const std::string& args) {
  static std::atomic<int> counter{0};
  const fs::path base = fs::path(::testing::TempDir()) /
                        ("tessera_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " >" + base.string() + ".out 2>" +
                          base.string() + ".err";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base.string() + ".out");
  r.err = slurp(base.string() + ".err");
  fs::remove(base.string() + ".out");
  fs::remove(base.string() + ".err");
  return r;
}

// Deploy options for MODEL into OUT on the default target (cpu), quiet, with `faults` injected.
inline DeployOptions deploy_options(const std::string& model, const std::string& out, FaultSet faults = {}) {
  DeployOptions o;
  o.model_path = model;
  o.out_dir = out;
  o.faults = std::move(faults);
  o.quiet = true;
  return o;
}

// Tiny checkpoints of the seed presets, synthesized once per test process and shared.
inline const std::string& tiny_model(const std::string& preset) {
  static std::mutex mu;
  static std::map<std::string, std::string> made;
  static ScratchDir root("tiny_models");
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find(preset);
  if (it != made.end()) return it->second;
  SynthOptions o;
  o.preset = preset;
  o.tiny = true;
  o.out_dir = root.str(preset);
  synth(o);
  return made[preset] = o.out_dir;
}

// The causes the debug skills confirmed, from issues.md's "Named cause(s): a; b" line.
inline std::vector<std::string> named_causes(const std::string& issues_md) {
  std::vector<std::string> out;
  const std::string key = "Named cause(s): ";
  const size_t at = issues_md.rfind(key);
  if (at == std::string::npos) return out;
  std::stringstream line(issues_md.substr(at + key.size(), issues_md.find('\n', at) - at - key.size()));
  for (std::string c; std::getline(line, c, ';');) out.push_back(c.substr(c.find_first_not_of(' ')));
  return out;
}
inline bool names_cause(const std::string& issues_md, const std::string& cause) {
  const std::vector<std::string> c = named_causes(issues_md);
  return std::find(c.begin(), c.end(), cause) != c.end();
}
// A cause read from the failure's own text (a refusal code, an evaluator finding): the
// "Reported cause(s): a; b" line.
inline bool reports_cause(const std::string& issues_md, const std::string& cause) {
  const std::string key = "Reported cause(s): ";
  const size_t at = issues_md.rfind(key);
  if (at == std::string::npos) return false;
  std::stringstream line(issues_md.substr(at + key.size(), issues_md.find('\n', at) - at - key.size()));
  for (std::string c; std::getline(line, c, ';');)
    if (c.substr(c.find_first_not_of(' ')) == cause) return true;
  return false;
}

// Phase 7 on an untouched deployment: PASS. Wall-time figures are not re-measured (ctest
// runs two tests at once, so they would not reproduce); the predicted ones are.
inline void expect_audit_passes(const std::string& dir) {
  AuditOptions ao;
  ao.dir = dir;
  ao.quiet = true;
  ao.remeasure_wall_time = false;
  const AuditResult audit = audit_deployment(ao);
  EXPECT_EQ(audit.verdict(), "PASS") << audit.to_json().dump(1);
}

// The tokenizer files scripts/setup.sh fetched (data/tokenizers/llama3, qwen3).
inline std::string tokenizers_dir() { return TESSERA_TOKENIZERS_DIR; }
inline std::string default_gguf() { return std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

}  // namespace tessera::testing_support
