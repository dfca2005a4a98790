#include "pipeline/deployment.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
constexpr const char* kIssuesHeader = "# Issues\n\nEvery gate failure, its diagnosis, and what fixed it.\n";
}  // namespace

const std::vector<PhaseDef>& phase_defs() {
  static const std::vector<PhaseDef> defs = {
      {0, "oracle", "load the model, build the FP32 oracle, check it", true},
      {1, "kernels", "every (kernel, shape) the model needs on the target vs the oracle's kernel", true},
      {2, "block", "layer 0 wired on the target with real prompt activations; bisect on failure", true},
      {3, "model", "all layers on the target over the canonical prompts", true},
      {4, "prefill-opt", "the target's optimization skills rewrite the plan for prefill, each gated and measured", true},
      {5, "decode-opt", "the target's optimization skills rewrite the plan for decode, each gated and measured", true},
      {6, "integrate", "one prefill+decode runner, greedy match vs the oracle, plan frozen", true},
      {7, "evaluate", "independent evaluator: `tessera audit DIR`, in its own process", false},
  };
  return defs;
}

const PhaseDef& phase_def(int id) {
  for (const PhaseDef& d : phase_defs())
    if (d.id == id) return d;
  fail("no phase {} (phases are 0 to 7)", id);
}

std::string now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {}", tmp.string());
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    if (!out) fail("cannot write {}", tmp.string());
  }
  fs::rename(tmp, path);
}

void write_json_atomic(const fs::path& path, const nlohmann::json& j) { write_file_atomic(path, j.dump(2) + "\n"); }

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read {}", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path.string(), e.what());
  }
}

namespace {
// What every reader of state.json looks up without checking (found by fuzz/fuzz_state.cc: a
// state.json without them made the const lookups undefined).
void check_state(const nlohmann::json& state, const fs::path& dir) {
  if (!state.is_object() || !state.contains("phases") || !state["phases"].is_object() || !state.contains("identity") ||
      !state["identity"].is_object())
    fail("{}/state.json is damaged: it needs a phases object and an identity object", dir.string());
}
}  // namespace

Deployment Deployment::open_for_deploy(const fs::path& dir, const nlohmann::json& identity) {
  Deployment d;
  d.dir_ = dir;
  if (fs::exists(dir / "state.json")) {
    d.state_ = read_json_file(dir / "state.json");
    check_state(d.state_, dir);
    const nlohmann::json& old = d.state_["identity"];
    for (const char* key : {"model_path", "target", "faults", "model_fingerprint", "plan", "device", "perturbations"})
      if (old.value(key, nlohmann::json()) != identity.value(key, nlohmann::json()))
        fail("{} holds a deployment of a different {} ({} there, {} asked); use another --out or delete it",
             dir.string(), key, old.value(key, nlohmann::json()).dump(), identity.value(key, nlohmann::json()).dump());
    return d;
  }
  if (fs::exists(dir) && !fs::is_directory(dir)) fail("{} exists and is not a directory", dir.string());
  if (fs::exists(dir) && !fs::is_empty(dir))
    fail("{} is not empty and holds no deployment (no state.json); choose an empty or new directory", dir.string());
  fs::create_directories(dir);
  d.state_ = {{"format", "tessera-deployment/1"},
              {"tessera_version", TESSERA_VERSION},
              {"created", now_iso8601()},
              {"identity", identity},
              {"phases", nlohmann::json::object()}};
  for (const PhaseDef& p : phase_defs())
    d.state_["phases"][std::to_string(p.id)] = {{"name", p.name}, {"status", p.implemented ? "pending" : "not-run"}};
  d.save_state();
  write_file_atomic(d.file("issues.md"), kIssuesHeader);
  return d;
}

Deployment Deployment::open_existing(const fs::path& dir) {
  if (!fs::exists(dir / "state.json")) fail("{} is not a tessera deployment (no state.json)", dir.string());
  Deployment d;
  d.dir_ = dir;
  d.state_ = read_json_file(dir / "state.json");
  if (d.state_.value("format", "") != "tessera-deployment/1")
    fail("{}/state.json is not a tessera deployment state", dir.string());
  check_state(d.state_, dir);
  return d;
}

bool phase_done(const std::string& status) { return status == "passed" || status == "unverified"; }

std::string Deployment::phase_status(int id) const {
  return state_.at("phases").value(std::to_string(id), nlohmann::json::object()).value("status", "pending");
}

nlohmann::json Deployment::phase_record(int id) const {
  return state_.at("phases").value(std::to_string(id), nlohmann::json::object());
}

void Deployment::set_phase(int id, const nlohmann::json& record) {
  state_["phases"][std::to_string(id)].update(record);
  save_state();
}

void Deployment::invalidate_from(int id) {
  for (const PhaseDef& p : phase_defs())
    if (p.id >= id && p.implemented) {
      state_["phases"][std::to_string(p.id)] = {{"name", p.name}, {"status", "pending"}};
      std::error_code ec;
      fs::remove_all(dir_ / fmt::format("phase{}", p.id), ec);  // per-item resume data
    }
  save_state();
}

void Deployment::append_issue(int phase, const std::string& title, const std::string& body) {
  std::string text;
  if (fs::exists(file("issues.md"))) {
    std::ifstream in(file("issues.md"));
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  } else {
    text = kIssuesHeader;
  }
  text += fmt::format("\n## {} phase {} ({}): {}\n\n{}\n", now_iso8601(), phase, phase_def(phase).name, title, body);
  write_file_atomic(file("issues.md"), text);
}

void Deployment::write_phase_timing() {
  std::string md = "# Phase timing\n\n| phase | name | status | wall time (s) | started | finished |\n|---|---|---|---|---|---|\n";
  double total = 0;
  for (const PhaseDef& p : phase_defs()) {
    const nlohmann::json r = phase_record(p.id);
    const double wall = r.value("wall_s", 0.0);
    total += wall;
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", p.id, p.name, r.value("status", "pending"),
                      r.contains("wall_s") ? fmt::format("{:.2f}", wall) : "", r.value("started", ""),
                      r.value("finished", ""));
  }
  md += fmt::format("\nTotal: {:.2f} s (summed over the last run of each phase).\n", total);
  write_file_atomic(file("phase_timing.md"), md);
}

void Deployment::save_state() { write_json_atomic(file("state.json"), state_); }

}  // namespace tessera
