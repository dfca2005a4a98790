// Test scaffolding, never linked into tessera: an LD_PRELOAD library that kills the process
// with SIGKILL in the middle of a file operation under one directory, so that
// tests/crash_safety.py can show that a deploy killed while writing leaves no half-written
// file and resumes. Nothing happens unless TESSERA_KILLSHIM_DIR is set.
//
//   TESSERA_KILLSHIM_DIR    the directory (absolute, as /proc/self/fd shows it) whose files count
//   TESSERA_KILLSHIM_OP     write | fsync | rename: the calls that count
//   TESSERA_KILLSHIM_MATCH  only files whose path contains this string count (optional)
//   TESSERA_KILLSHIM_AT     kill inside the N-th call that counts (1-based); 0: kill nothing,
//                           log every call that counts
//   TESSERA_KILLSHIM_LOG    a file (outside the directory) that gets one line per logged call:
//                           "OP PATH BYTES_WRITTEN/BYTES_ASKED" (write) or "OP PATH" (fsync, rename)
//
// write: the first half of the buffer is written, then SIGKILL (the file is left half-written
// on disk, as a crash would leave it). fsync and rename: SIGKILL before the call.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

namespace {

using write_fn = ssize_t (*)(int, const void*, size_t);
using fsync_fn = int (*)(int);
using rename_fn = int (*)(const char*, const char*);

write_fn real_write() {
  static write_fn f = reinterpret_cast<write_fn>(dlsym(RTLD_NEXT, "write"));
  return f;
}

struct Config {
  const char* dir = nullptr;
  const char* op = "";
  const char* match = nullptr;
  long at = 0;
  const char* log = nullptr;
};

const Config& config() {
  static const Config c = [] {
    Config k;
    k.dir = getenv("TESSERA_KILLSHIM_DIR");
    if (const char* op = getenv("TESSERA_KILLSHIM_OP")) k.op = op;
    k.match = getenv("TESSERA_KILLSHIM_MATCH");
    if (const char* at = getenv("TESSERA_KILLSHIM_AT")) k.at = strtol(at, nullptr, 10);
    k.log = getenv("TESSERA_KILLSHIM_LOG");
    return k;
  }();
  return c;
}

long counter = 0;

bool counts(const char* op, const char* path) {
  const Config& c = config();
  if (!c.dir || !path || strcmp(c.op, op) != 0) return false;
  const size_t n = strlen(c.dir);
  if (strncmp(path, c.dir, n) != 0 || (path[n] != '/' && path[n] != '\0')) return false;
  return !c.match || strstr(path, c.match);
}

bool fd_path(int fd, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, out, size - 1);
  if (n <= 0) return false;
  out[n] = '\0';
  return true;
}

void log_line(const char* line) {
  const Config& c = config();
  if (!c.log) return;
  const int fd = open(c.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  real_write()(fd, line, strlen(line));
  close(fd);
}

// Whether this call is the one to die in (and logs it, or every call when AT is 0).
bool this_one(const char* what) {
  const long n = __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST);
  const long at = config().at;
  if (at == 0 || n == at) log_line(what);
  return at > 0 && n == at;
}

[[noreturn]] void die() {
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

}  // namespace

extern "C" ssize_t write(int fd, const void* buf, size_t count) {
  char path[4096];
  if (config().dir && fd_path(fd, path, sizeof path) && counts("write", path)) {
    char what[4200];
    const size_t half = count / 2;
    snprintf(what, sizeof what, "write %s %zu/%zu\n", path, half, count);
    if (this_one(what)) {
      if (half) real_write()(fd, buf, half);
      die();
    }
  }
  return real_write()(fd, buf, count);
}

extern "C" int fsync(int fd) {
  static fsync_fn real = reinterpret_cast<fsync_fn>(dlsym(RTLD_NEXT, "fsync"));
  char path[4096];
  if (config().dir && fd_path(fd, path, sizeof path) && counts("fsync", path)) {
    char what[4200];
    snprintf(what, sizeof what, "fsync %s\n", path);
    if (this_one(what)) die();
  }
  return real(fd);
}

extern "C" int rename(const char* from, const char* to) {
  static rename_fn real = reinterpret_cast<rename_fn>(dlsym(RTLD_NEXT, "rename"));
  if (config().dir && counts("rename", to)) {
    char what[8400];
    snprintf(what, sizeof what, "rename %s -> %s\n", from, to);
    if (this_one(what)) die();
  }
  return real(from, to);
}
