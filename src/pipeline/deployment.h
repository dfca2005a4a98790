// The deployment directory (design section 7): the deployment's memory, readable by a
// person and by an agent, and enough to resume. state.json is the contract between
// phases; every file is written atomically (temporary file, fsync, rename), so a process
// killed at any moment leaves each file either old or new, never half-written. A deploy
// holds the directory's lock (flock on the directory itself: the kernel drops it when the
// process dies, so a killed deploy never leaves a stale lock behind).
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/error.h"

namespace tessera {

// A file could not be written or created (a full disk, a read-only file system): never a
// verdict on the work, so the phase runner, which turns a target's refusal (Error) into a
// failed phase, lets it through to the user as one line.
class IoError : public Error {
 public:
  using Error::Error;
};

// "cannot VERB PATH: <what errno `err` means here>", one line: ENOSPC and EROFS named as such.
std::string io_error_message(const std::string& verb, const std::filesystem::path& path, int err);

// The phases tessera runs today, in order, and their names.
class Deployment;
class PhaseContext;   // pipeline/phases.h
struct PhaseOutcome;  // pipeline/phases.h

// A phase of the pipeline as `tessera deploy` runs it: the deploy loop knows phases only
// through these entries (adding a phase is one entry: register_phase).
struct PhaseDef {
  int id;
  const char* name;
  const char* does;
  // Runs the phase and its gate; nullptr: not run by `tessera deploy` (phase 7 runs apart,
  // `tessera audit`).
  PhaseOutcome (*run)(PhaseContext&) = nullptr;
  // What the phase leaves beside its record, after it ran (nullptr: nothing): phase 1 the
  // kernel registry and the first plan, phases 4-5 the trajectory, phase 6 the frozen plan.
  void (*record)(Deployment&, PhaseContext&, const PhaseOutcome&) = nullptr;
  // The phase rewrites plan.json: a resumed deploy runs the later phases on the plan it left.
  bool rewrites_plan = false;
  bool implemented() const { return run != nullptr; }
};
// The phases in id order: the built-in 0-7 (pipeline/deploy.cc), then any registered.
const std::vector<PhaseDef>& phase_defs();
const PhaseDef& phase_def(int id);
// Adds a phase (a test's toy phase) to phase_defs, kept in id order; an id taken is refused.
void register_phase(const PhaseDef& def);

// Writes a temporary file beside PATH (PATH.tmp<pid>), fsyncs it, renames it over PATH and
// fsyncs the directory; on any failure the temporary is removed, PATH is left as it was and
// an IoError names PATH and the cause.
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);
// Whether NAME is one of write_file_atomic's temporaries (ends in ".tmp<digits>").
bool is_atomic_temporary(const std::string& name);
void write_json_atomic(const std::filesystem::path& path, const nlohmann::json& j);
nlohmann::json read_json_file(const std::filesystem::path& path);  // throws naming the file

// A phase whose work is done: "passed", or phase 0's "unverified" (no independent
// reference: the oracle's own checks passed, nothing proved it equal to transformers).
bool phase_done(const std::string& status);

// What a deployment's identity says was done to it on purpose: "" for a deployment of the
// model as it is, else one sentence naming the injected faults (--inject) and perturbations
// (--perturb). Such a deployment is a test of the gates, never one to use: deploy's last
// line, issues.md, the audit (FAIL), diagnose and report.html say so first.
std::string altered_on_purpose(const nlohmann::json& identity);

class Deployment {
 public:
  // Opens DIR for a deployment of `model_path` on `target`, creating it if needed. An
  // existing directory must belong to the same model, target and injected faults, be
  // writable (a read-only one is refused before anything is touched) and not be held by
  // another live deploy; the temporaries a killed deploy left are removed.
  static Deployment open_for_deploy(const std::filesystem::path& dir, const nlohmann::json& identity);
  // Opens an existing deployment (for `run`, `bench`); throws if DIR is not one.
  static Deployment open_existing(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path file(const std::string& name) const { return dir_ / name; }
  const nlohmann::json& state() const { return state_; }
  const nlohmann::json& identity() const { return state_["identity"]; }

  std::string phase_status(int id) const;  // "pending", "running", "passed", "unverified", "failed", "not-run"
  nlohmann::json phase_record(int id) const;
  void set_phase(int id, const nlohmann::json& record);  // merges into state.json, saves
  // Marks phases >= id pending again (--from-phase) and removes their artifacts' resume data.
  void invalidate_from(int id);

  void append_issue(int phase, const std::string& title, const std::string& body);
  void write_phase_timing();  // phase_timing.md from state.json
  void save_state();

 private:
  std::filesystem::path dir_;
  nlohmann::json state_;
  std::shared_ptr<int> lock_;  // the locked directory's descriptor (open_for_deploy only)
};

std::string now_iso8601();

}  // namespace tessera
