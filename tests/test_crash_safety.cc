// Crash safety of the deployment directory (issue 20), one test per product fix; the kill -9
// run over every phase, the full disk and the read-only directory end to end are
// tests/crash_safety.py (ctest DeployCrashSafety.*).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <functional>
#include <string>

#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "util/error.h"
#include "util/sha256.h"
#include "test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing_support::deploy_options;
using testing_support::ScratchDir;
using testing_support::slurp;
using testing_support::tiny_model;

const nlohmann::json kIdentity = {{"model_path", "/models/m"}, {"target", "cpu"}};

// A pid that no process has any more.
pid_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

bool write_proc(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  return ok;
}

// Runs `body` in a child process inside a private user + mount namespace with a tmpfs of
// `size` mounted on `dir`. The child reports "OK", "SKIP: why" or "FAIL: why" through a pipe.
std::string in_private_tmpfs(const fs::path& dir, const std::string& size, const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return "FAIL: pipe";
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string report;
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      report = std::string("SKIP: no private user and mount namespace here (unshare: ") + std::strerror(errno) + ")";
    } else {
      write_proc("/proc/self/setgroups", "deny");
      write_proc("/proc/self/uid_map", fmt::format("0 {} 1", uid));
      write_proc("/proc/self/gid_map", fmt::format("0 {} 1", gid));
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
      if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) {
        report = std::string("SKIP: cannot mount a tmpfs here (") + std::strerror(errno) + ")";
      } else {
        try {
          report = body();
        } catch (const std::exception& e) {
          report = std::string("FAIL: ") + e.what();
        }
      }
    }
    (void)!::write(fds[1], report.data(), report.size());
    _exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return "FAIL: the child died";
  return report;
}

#define EXPECT_REPORT_OK(report)                                           \
  do {                                                                     \
    const std::string r_ = (report);                                       \
    if (r_.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << r_.substr(6);          \
    EXPECT_EQ(r_, "OK");                                                   \
  } while (0)

TEST(CrashSafety, AtomicWriteReplacesTheWholeFileAndLeavesNoTemporary) {
  ScratchDir d("atomic");
  const fs::path f = d.path() / "a.json";
  write_file_atomic(f, "old\n");
  write_file_atomic(f, "new\n");
  EXPECT_EQ(slurp(f), "new\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator()), 1);
  EXPECT_TRUE(is_atomic_temporary("state.json.tmp123"));
  EXPECT_FALSE(is_atomic_temporary("state.json.tmp"));
  EXPECT_FALSE(is_atomic_temporary("notes.tmpx1"));
}

// Before: an std::ofstream whose failure said only "cannot write X.tmpPID", and the
// temporary left behind on the full disk.
TEST(CrashSafety, FullDiskKeepsTheOldFileAndNamesENOSPC) {
  ScratchDir d("enospc");
  const fs::path f = d.path() / "state.json";
  EXPECT_REPORT_OK(in_private_tmpfs(d.path(), "16k", [&]() -> std::string {
    write_file_atomic(f, "old\n");
    try {
      write_file_atomic(f, std::string(256 * 1024, 'x'));
      return "FAIL: no error on a full disk";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      if (msg.find("cannot write " + f.string() + ": no space left on the device (ENOSPC)") == std::string::npos)
        return "FAIL: unclear message: " + msg;
      if (msg.find('\n') != std::string::npos) return "FAIL: more than one line: " + msg;
    }
    if (slurp(f) != "old\n") return "FAIL: the old file was not kept";
    if (std::distance(fs::directory_iterator(d.path()), fs::directory_iterator()) != 1) return "FAIL: a temporary was left";
    return "OK";
  }));
}

// Before: a read-only directory failed at the first write (root ignores permission bits)
// with an internal filesystem error, after --from-phase had started removing resume data.
TEST(CrashSafety, ReadOnlyDirectoryIsRefusedBeforeAnythingChanges) {
  ScratchDir d("erofs");
  EXPECT_REPORT_OK(in_private_tmpfs(d.path(), "1m", [&]() -> std::string {
    const fs::path dep = d.path() / "dep";
    { Deployment::open_for_deploy(dep, kIdentity); }
    const std::string state = slurp(dep / "state.json");
    if (::mount(nullptr, d.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0)
      return std::string("SKIP: cannot remount read-only (") + std::strerror(errno) + ")";
    try {
      Deployment::open_for_deploy(dep, kIdentity);
      return "FAIL: a read-only deployment was opened for deploy";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      if (msg != "cannot deploy into " + dep.string() + ": it is on a read-only file system (EROFS); nothing was changed")
        return "FAIL: unclear message: " + msg;
    }
    return slurp(dep / "state.json") == state ? "OK" : "FAIL: state.json changed";
  }));
}

// There was no lock: two deploys could write one directory at once. The lock is an flock on
// the directory, which the kernel drops when its holder dies: no stale lock after kill -9.
TEST(CrashSafety, ALiveDeployHoldsTheDirectoryAndAKilledOneDoesNot) {
  ScratchDir d("lock");
  const fs::path dep = d.path() / "dep";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    try {
      Deployment held = Deployment::open_for_deploy(dep, kIdentity);
      (void)!::write(fds[1], "y", 1);
      for (;;) pause();
    } catch (...) {
      _exit(1);
    }
  }
  ::close(fds[1]);
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1) << "the child could not open the deployment";
  ::close(fds[0]);
  try {
    Deployment::open_for_deploy(dep, kIdentity);
    ADD_FAILURE() << "a second deploy opened a directory a live one holds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is being deployed by another tessera process"), std::string::npos) << e.what();
  }
  ::kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_NO_THROW(Deployment::open_for_deploy(dep, kIdentity));
}

// Before: a deploy killed while writing its first state.json left only state.json.tmpPID,
// and the resume refused the directory as "not empty and holds no deployment"; temporaries
// of killed runs stayed in the deployment for good.
TEST(CrashSafety, TemporariesOfAKilledDeployAreRemovedOnResume) {
  ScratchDir d("temps");
  const fs::path fresh = d.path() / "fresh";
  fs::create_directories(fresh);
  const std::string dead = std::to_string(dead_pid());
  testing_support::write_file(fresh / ("state.json.tmp" + dead), "{\"form");
  EXPECT_NO_THROW(Deployment::open_for_deploy(fresh, kIdentity));
  EXPECT_FALSE(fs::exists(fresh / ("state.json.tmp" + dead)));
  EXPECT_TRUE(fs::exists(fresh / "state.json"));

  fs::create_directories(fresh / "phase3");
  testing_support::write_file(fresh / "phase3" / ("prompt_0.json.tmp" + dead), "{\"ids\": [1,");
  testing_support::write_file(fresh / ("gates.md.tmp" + dead), "# Gate res");
  testing_support::write_file(fresh / "notes.tmp", "mine");  // not a temporary of tessera's
  testing_support::write_file(fresh / "plan.json.tmp1", "{");  // pid 1 lives: not ours to remove
  EXPECT_NO_THROW(Deployment::open_for_deploy(fresh, kIdentity));
  EXPECT_FALSE(fs::exists(fresh / "phase3" / ("prompt_0.json.tmp" + dead)));
  EXPECT_FALSE(fs::exists(fresh / ("gates.md.tmp" + dead)));
  EXPECT_TRUE(fs::exists(fresh / "notes.tmp"));
  EXPECT_TRUE(fs::exists(fresh / "plan.json.tmp1"));

  // A directory of someone else's files is still refused, and none of them is touched.
  const fs::path other = d.path() / "other";
  fs::create_directories(other);
  testing_support::write_file(other / ("x.tmp" + dead), "");
  testing_support::write_file(other / "y.txt", "");
  EXPECT_THROW(Deployment::open_for_deploy(other, kIdentity), Error);
  EXPECT_TRUE(fs::exists(other / ("x.tmp" + dead)));
}

// Before: a deploy killed after phase 6's status was saved, before gates.md and report.json
// were rewritten, resumed straight to the manifest, which then hashed the stale report.
TEST(CrashSafety, ResumeRewritesTheFilesDerivedFromState) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "pipeline bookkeeping on whole deploys: the Release run's (CI time)";
#endif
  ScratchDir out("derived");
  const std::string model = tiny_model("SmolLM2-360M");
  ASSERT_TRUE(deploy(deploy_options(model, out.str("dep"))).pass);
  const fs::path dep = out.path() / "dep";
  const std::string report = slurp(dep / "report.json"), gates = slurp(dep / "gates.md");
  write_json_atomic(dep / "report.json", {{"format", "tessera-report/1"}, {"phases", nlohmann::json::object()}});
  write_file_atomic(dep / "gates.md", "# Gate results\n");
  ASSERT_TRUE(deploy(deploy_options(model, out.str("dep"))).pass);
  EXPECT_EQ(slurp(dep / "report.json"), report);
  EXPECT_EQ(slurp(dep / "gates.md"), gates);
  EXPECT_EQ(read_json_file(dep / "manifest.json")["report.json"], sha256_file_hex((dep / "report.json").string()));
}

}  // namespace
}  // namespace tessera
