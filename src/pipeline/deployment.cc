#include "pipeline/deployment.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>

#include "util/error.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
constexpr const char* kIssuesHeader = "# Issues\n\nEvery gate failure, its diagnosis, and what fixed it.\n";
}  // namespace

std::string altered_on_purpose(const nlohmann::json& identity) {
  std::vector<std::string> what;
  const auto list = [&](const char* key, const char* flag) {
    const auto it = identity.find(key);
    if (it == identity.end() || !it->is_array() || it->empty()) return;
    std::vector<std::string> names;
    for (const auto& v : *it) names.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    what.push_back(fmt::format("{} {} ({})", names.size() == 1 ? std::string(key).substr(0, std::strlen(key) - 1) : key,
                               fmt::join(names, ", "), flag));
  };
  list("faults", "--inject");
  list("perturbations", "--perturb");
  if (what.empty()) return "";
  return fmt::format("made with {} on purpose: a test of the gates, not the model as it is; do not use it",
                     fmt::join(what, " and "));
}

const PhaseDef& phase_def(int id) {
  for (const PhaseDef& d : phase_defs())
    if (d.id == id) return d;
  fail("no phase {} (phases are {} to {})", id, phase_defs().front().id, phase_defs().back().id);
}

std::string now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string io_error_message(const std::string& verb, const fs::path& path, int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return fmt::format("cannot {} {}: no space left on the device ({}); what was written before is intact: free some "
                         "space and run the command again", verb, path.string(), err == ENOSPC ? "ENOSPC" : "EDQUOT");
    case EROFS: return fmt::format("cannot {} {}: read-only file system (EROFS)", verb, path.string());
    case EACCES: return fmt::format("cannot {} {}: permission denied (EACCES)", verb, path.string());
    default: return fmt::format("cannot {} {}: {} (errno {})", verb, path.string(), std::strerror(err), err);
  }
}

namespace {

[[noreturn]] void abandon_temporary(int fd, const fs::path& tmp, const fs::path& path, int err) {
  if (fd >= 0) ::close(fd);
  ::unlink(tmp.c_str());
  throw IoError(io_error_message("write", path, err));
}

// The rename is durable once the directory is: fsync it (best effort; some file systems
// refuse fsync on a directory).
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + fmt::format(".tmp{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) abandon_temporary(-1, tmp, path, errno);
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) abandon_temporary(fd, tmp, path, n < 0 ? errno : ENOSPC);
    done += size_t(n);
  }
  if (::fsync(fd) != 0) abandon_temporary(fd, tmp, path, errno);
  if (::close(fd) != 0) abandon_temporary(-1, tmp, path, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) abandon_temporary(-1, tmp, path, errno);
  sync_directory(path.parent_path());
}

bool is_atomic_temporary(const std::string& name) {
  const size_t at = name.rfind(".tmp");
  if (at == std::string::npos || at + 4 == name.size()) return false;
  return std::all_of(name.begin() + long(at + 4), name.end(), [](char c) { return c >= '0' && c <= '9'; });
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

namespace {

// A deploy refuses a directory it could not write to before touching anything in it.
void check_writable(const fs::path& dir) {
  if (::access(dir.c_str(), W_OK) == 0) return;
  const int err = errno;
  throw IoError(fmt::format("cannot deploy into {}: {}; nothing was changed", dir.string(),
                            err == EROFS    ? "it is on a read-only file system (EROFS)"
                            : err == EACCES ? "permission denied (EACCES)"
                                            : std::strerror(err)));
}

// The directory's lock: flock on the directory itself, held while the descriptor is open
// (close-on-exec, so no child inherits it). The kernel drops it when the process dies,
// however it dies, so a killed deploy never leaves a lock that blocks the next one.
std::shared_ptr<int> lock_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError(io_error_message("open", dir, errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK)
      fail("{} is being deployed by another tessera process right now (it holds the directory's lock); wait for it to "
           "finish, or use another --out", dir.string());
    throw IoError(io_error_message("lock", dir, err));
  }
  return std::shared_ptr<int>(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
}

// The temporaries of writers that died before their rename (a killed deploy) under DIR:
// under the lock no other deploy writes here; a temporary whose process still lives is kept.
std::vector<fs::path> dead_temporaries(const fs::path& dir, bool recursive) {
  std::vector<fs::path> dead;
  std::error_code ec;
  auto consider = [&](const fs::directory_entry& e) {
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    if (!e.is_regular_file(ec2) || !is_atomic_temporary(name)) return;
    const long pid = std::strtol(name.c_str() + name.rfind(".tmp") + 4, nullptr, 10);
    if (pid == long(::getpid()) || (::kill(pid_t(pid), 0) != 0 && errno == ESRCH)) dead.push_back(e.path());
  };
  if (recursive)
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      consider(*it);
  else
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) consider(*it);
  return dead;
}

void remove_all_of(const std::vector<fs::path>& files) {
  for (const fs::path& p : files) {
    std::error_code ec;
    if (!fs::remove(p, ec) && ec) throw IoError(io_error_message("remove", p, ec.value()));
  }
}

}  // namespace

Deployment Deployment::open_for_deploy(const fs::path& dir, const nlohmann::json& identity) {
  Deployment d;
  d.dir_ = dir;
  if (fs::exists(dir) && !fs::is_directory(dir)) fail("{} exists and is not a directory", dir.string());
  if (fs::exists(dir)) {
    check_writable(dir);
  } else {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(io_error_message("create", dir, ec.value()));
  }
  d.lock_ = lock_directory(dir);
  if (fs::exists(dir / "state.json")) {
    remove_all_of(dead_temporaries(dir, true));
    d.state_ = read_json_file(dir / "state.json");
    check_state(d.state_, dir);
    const nlohmann::json& old = d.state_["identity"];
    for (const char* key : {"model_path", "target", "faults", "model_fingerprint", "plan", "device", "perturbations"})
      if (old.value(key, nlohmann::json()) != identity.value(key, nlohmann::json()))
        fail("{} holds a deployment of a different {} ({} there, {} asked); use another --out or delete it",
             dir.string(), key, old.value(key, nlohmann::json()).dump(), identity.value(key, nlohmann::json()).dump());
    return d;
  }
  // A deploy killed while writing its first state.json leaves only that temporary.
  const std::vector<fs::path> dead = dead_temporaries(dir, false);
  if (size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator())) != dead.size())
    fail("{} is not empty and holds no deployment (no state.json); choose an empty or new directory", dir.string());
  remove_all_of(dead);
  d.state_ = {{"format", "tessera-deployment/1"},
              {"tessera_version", TESSERA_VERSION},
              {"created", now_iso8601()},
              {"identity", identity},
              {"phases", nlohmann::json::object()}};
  for (const PhaseDef& p : phase_defs())
    d.state_["phases"][std::to_string(p.id)] = {{"name", p.name}, {"status", p.implemented() ? "pending" : "not-run"}};
  d.save_state();
  const std::string altered = altered_on_purpose(identity);
  write_file_atomic(d.file("issues.md"), altered.empty() ? std::string(kIssuesHeader)
                                                         : fmt::format("{}\n**This deployment was {}.**\n", kIssuesHeader, altered));
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
    if (p.id >= id && p.implemented()) {
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
