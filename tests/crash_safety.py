#!/usr/bin/env python3
"""Crash safety of `tessera deploy` (issue 20), all of it from outside the product.

  kill      SIGKILL at 20+ moments spread over phases 0-6 (Release; fewer under sanitizers),
            each followed by a resume of the same directory: timed kills (a random moment
            after a phase's start line) and kills inside a file operation on the deployment
            (tests/killshim: write half a buffer then die, or die before fsync / rename).
            After every kill: the phases that had passed still have, every JSON file parses,
            every Markdown file is whole. At the end the resumed deployment passes, no
            temporary is left, and every file (every gate row, state.json, report.json, the
            manifest) matches an uninterrupted deploy of the same model, timing fields aside.
  diskfull  the deploy writes into a small private tmpfs: one clear error line naming the
            full disk and the file, exit 1, the phases before intact; after the tmpfs grows
            the resume completes without redoing them.
  readonly  a deployment whose phases 0-3 passed on a read-only mount: a resume and a
            --from-phase each give one clear error and change nothing; once writable again
            the resume completes.

diskfull and readonly need a private mount namespace (`unshare -rm`); where that is not
allowed they exit 77 (ctest: skipped) with the reason. Every kill point is printed.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
PRESET = "SmolLM2-360M"  # the smallest tiny preset (10.6M parameters, 3 layers)
# Fields that hold wall-clock times or measured speeds; nothing else is ignored.
TIMING_KEYS = {"created", "started", "finished", "wall_s"}
MEASURED_SPEED = {"target_timing", "phase6_target_timing"}  # phase 6's measured tok/s on the host
SPEED_KEYS = {"prefill_tokens_per_s", "decode_tokens_per_s"}
PHASE_NAMES = ["oracle", "kernels", "block", "model", "prefill-opt", "decode-opt", "integrate"]
TEMP_RE = re.compile(r"\.tmp\d+$")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return cond


def say(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- the deployment's files

def files_of(d):
    out = []
    for root, _, names in os.walk(d):
        for n in names:
            out.append(os.path.relpath(os.path.join(root, n), d))
    return sorted(out)


def temporaries(d):
    return [f for f in files_of(d) if TEMP_RE.search(f)]


def snapshot(d):
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in files_of(d)}


def whole_files_problems(d):
    """Every file that is not a temporary must be whole: JSON parses, Markdown ends its last line."""
    bad = []
    for f in files_of(d):
        if TEMP_RE.search(f):
            continue
        data = open(os.path.join(d, f), "rb").read()
        if f.endswith(".json"):
            try:
                json.loads(data)
            except ValueError as e:
                bad.append(f"{f} does not parse ({e})")
        elif f.endswith(".md") and (not data or not data.endswith(b"\n")):
            bad.append(f"{f} is cut short ({len(data)} bytes)")
    return bad


def state(d):
    p = os.path.join(d, "state.json")
    return json.load(open(p)) if os.path.exists(p) else None


def statuses(d):
    s = state(d)
    return {int(k): v.get("status") for k, v in s["phases"].items()} if s else {}


def normalize(x, parent=None):
    if isinstance(x, dict):
        return {k: normalize(v, k) for k, v in x.items()
                if k not in TIMING_KEYS and not (parent in MEASURED_SPEED and k in SPEED_KEYS)}
    if isinstance(x, list):
        return [normalize(v) for v in x]
    return x


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def compare_with_reference(ref, got, tessera):
    """Every file of the uninterrupted deploy against the resumed one, timings aside."""
    rf, gf = files_of(ref), files_of(got)
    check(rf == gf, f"the resumed deployment's files differ from the uninterrupted one's: "
                    f"only there {sorted(set(rf) - set(gf))}, only here {sorted(set(gf) - set(rf))}")
    rows = 0
    for f in rf:
        if f not in gf:
            continue
        a, b = os.path.join(ref, f), os.path.join(got, f)
        if f == "manifest.json":
            ma, mb = json.load(open(a)), json.load(open(b))
            check(set(ma) == set(mb), f"manifest keys differ: {sorted(ma)} vs {sorted(mb)}")
            for k in ma:
                if k == "report.json":  # report.json holds the phases' times: its hash is checked below
                    continue
                check(ma[k] == mb.get(k), f"manifest.json[{k}] differs: {ma[k]} vs {mb.get(k)}")
            for m, d in ((ma, ref), (mb, got)):
                check(m.get("report.json") == sha256(os.path.join(d, "report.json")),
                      f"{d}/manifest.json's report.json hash is not that of its report.json")
                check(m.get("plan.json") == sha256(os.path.join(d, "plan.json")),
                      f"{d}/manifest.json's plan.json hash is not that of its plan.json")
        elif f.endswith(".json"):
            ja, jb = json.load(open(a)), json.load(open(b))
            if isinstance(ja, dict) and isinstance(ja.get("gates"), list):
                rows += len(ja["gates"])
                check(ja["gates"] == jb.get("gates"), f"{f}: the gate rows differ")
            check(normalize(ja) == normalize(jb), f"{f} differs from the uninterrupted deploy's (timing fields aside)")
        elif f == "report.html":
            # The page draws the phases' times, so it is not compared byte for byte: each
            # deployment's page must be the one `tessera report` makes from its directory now
            # (not left stale by a kill), and the directories' other files are compared here.
            for d in (ref, got):
                fresh = os.path.join(os.path.dirname(d), os.path.basename(d) + ".report.html")
                r = subprocess.run([tessera, "report", d, "--out", fresh], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
                check(r.returncode == 0 and open(fresh, "rb").read() == open(os.path.join(d, f), "rb").read(),
                      f"{d}/report.html is not the page its directory gives now (exit {r.returncode}: {r.stderr.strip()})")
        elif f == "phase_timing.md":  # a table of times: phase, name and status must agree
            cut = lambda p: [l.split("|")[1:4] for l in open(p) if l.startswith("| ") and "wall time" not in l]
            check(cut(a) == cut(b), "phase_timing.md: the phases' statuses differ")
        else:
            check(open(a, "rb").read() == open(b, "rb").read(), f"{f} differs from the uninterrupted deploy's")
    return rows, len(rf)


# ---------------------------------------------------------------- running tessera

class Runner:
    def __init__(self, args, model):
        self.tessera, self.shim, self.model = args.tessera, args.shim, model
        self.sanitized = args.sanitized

    def cmd(self, out, target, *extra):
        return [self.tessera, "deploy", self.model, "--target", target, "--out", out, *extra]

    def env(self, shim=None):
        env = dict(os.environ)
        if shim:
            env["LD_PRELOAD"] = self.shim
            env.update(shim)
            # An ASan binary wants its runtime first among the preloaded libraries.
            env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0").lstrip(":")
        return env

    def run(self, out, target, *extra, shim=None):
        return subprocess.run(self.cmd(out, target, *extra), env=self.env(shim), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    def start(self, out, target, *extra, shim=None):
        return subprocess.Popen(self.cmd(out, target, *extra), env=self.env(shim), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, bufsize=1)


START_RE = re.compile(r"^phase (\d) (\S+): (.*)$")


def phase_start(line):
    """The phase whose work starts with this stderr line (not a resumed one), or None."""
    m = START_RE.match(line.rstrip("\n"))
    if not m or m.group(3).endswith("(resumed)"):
        return None
    return int(m.group(1))


def timed_reference(runner, out, target):
    """An uninterrupted deploy, and how long each phase took (stderr line to stderr line)."""
    t0 = time.monotonic()
    p = runner.start(out, target)
    starts, ends, cur = {}, {}, None
    for line in p.stderr:
        now = time.monotonic()
        ph = phase_start(line)
        if ph is not None:
            cur = ph
            starts[ph] = now
        elif line.startswith("  -> ") and cur is not None:
            ends[cur] = now
    rc = p.wait()
    durations = {ph: ends[ph] - starts[ph] for ph in starts if ph in ends}
    return rc, durations, time.monotonic() - t0


def synth_model(args, work):
    model = os.path.join(work, "model")
    r = subprocess.run([args.tessera, "synth", "--preset", PRESET, "--tiny", "--out", model],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        say(f"cannot synthesize the tiny model: {r.stderr.strip()}")
        sys.exit(1)
    return model


# ---------------------------------------------------------------- kill -9 at 20+ moments

def kill_plan(sanitized):
    """The chain of invocations on one directory, in order. ("timed", Q): a random moment
    after the start line of the first phase >= Q that the invocation runs. ("op", Q, OP,
    MATCH, N, what): inside the N-th OP (write: after half the buffer; fsync, rename: before
    the call) on a file of the deployment whose path contains MATCH, in an invocation that
    runs phase Q (skipped, and said, when phase Q has already passed: an earlier timed kill
    landed late; Q 7 means after phase 6, before the manifest). Where each kill lands is read
    back from state.json, not assumed."""
    n = 1 if sanitized else 3
    full = not sanitized
    op = lambda *a: [("op", *a)]
    timed = lambda q: [("timed", q)] * n
    return (op(-1, "write", "state.json", 1, "the new deployment's first state.json")
            + op(0, "write", "phase0.json", 1, "phase0.json") + timed(0)
            + op(1, "write", "kernel_registry.json", 1, "kernel_registry.json")
            + op(1, "fsync", "plan.json", 1, "plan.json") * full + timed(1)
            + op(2, "write", "phase2.json", 1, "phase2.json") + timed(2)
            + op(2, "write", "gates.md", 1, "gates.md (phase 2 just passed)") * full
            + op(3, "write", "phase3/prompt_", 3, "the third per-prompt record") + timed(3)
            + op(4, "write", "plan_phase4.json", 1, "plan_phase4.json") + timed(4)
            + op(5, "write", "phase5.json", 1, "phase5.json")
            + op(5, "rename", "state.json", 2, "state.json (phase 5 about to be recorded passed)") * full
            + op(5, "write", "perf_opt_traj.md", 1, "perf_opt_traj.md") * full + timed(5)
            + timed(6) + op(6, "rename", "report.json", 1, "report.json (phase 6 just passed)")
            + op(7, "write", "manifest.json", 1, "manifest.json"))


def landed(d):
    st = statuses(d)
    running = [p for p, s in st.items() if s == "running"]
    if running:
        return running[0], f"in phase {running[0]} ({PHASE_NAMES[running[0]]}, running)"
    passed = [p for p, s in st.items() if s in ("passed", "unverified")]
    if not st:
        return -1, "before state.json existed"
    last = max(passed) if passed else -1
    if last == 6:
        return 6, "after phase 6 passed (manifest not yet written)" if not os.path.exists(os.path.join(d, "manifest.json")) else "after phase 6"
    return last, f"between phase {last} and phase {last + 1}"


def mode_kill(args, work):
    target = "npusim"  # its phase 4-5 figures are modelled: an uninterrupted deploy is reproducible
    model = synth_model(args, work)
    runner = Runner(args, model)
    ref = os.path.join(work, "uninterrupted")
    rc, dur, wall = timed_reference(runner, ref, target)
    if not check(rc == 0, f"the uninterrupted deploy failed (exit {rc})"):
        return
    say(f"uninterrupted deploy: {wall:.1f} s; phases (s): " + ", ".join(f"{p} {dur[p]:.2f}" for p in sorted(dur)))
    dep = os.path.realpath(os.path.join(work, "killed"))
    rng = random.Random(args.seed)
    plan = kill_plan(args.sanitized)
    say(f"seed {args.seed}: {len(plan)} invocations planned, each killed with SIGKILL, then the next resumes {dep}")
    points, per_phase, ever_passed = [], {}, set()
    lock_checked = False
    t_chain = time.monotonic()
    for step in plan:
        before = statuses(dep)
        ever_passed |= {p for p, s in before.items() if s in ("passed", "unverified")}
        if step[0] == "timed":
            # The first phase from `step[1]` on that this invocation runs (an earlier kill that
            # landed late may have finished the one meant). Where phase step[1] has passed already
            # (on a loaded machine a timed kill can land after the deploy ended), --from-phase
            # runs it again, so every phase still gets its kills.
            redo = ("--from-phase", str(step[1])) if before.get(step[1]) in ("passed", "unverified") else ()
            if redo:  # those phases are discarded on purpose, not lost
                ever_passed -= {q for q in ever_passed if q >= step[1]}
            p = runner.start(dep, target, *redo)
            ph = None
            for line in p.stderr:
                started = phase_start(line)
                if started is not None and started >= step[1]:
                    ph = started
                    break
            if ph is None:
                p.wait()
                check(False, f"timed kill in phase {step[1]}: no phase from {step[1]} on started (exit {p.returncode})")
                continue
            delay = rng.uniform(0.0, 0.6 * dur.get(ph, 0.2))
            t_seen = time.monotonic()
            if not lock_checked and ph == 4:  # a live deploy holds the directory: a second one is refused
                lock_checked = True
                r2 = runner.run(dep, target, "--quiet")
                check(r2.returncode == 1 and "being deployed by another tessera process" in r2.stderr,
                      f"a second deploy beside a live one was not refused: exit {r2.returncode}: {r2.stderr.strip()}")
                say("  (a second deploy started beside the live one was refused: "
                    f"{r2.stderr.strip().splitlines()[-1] if r2.stderr.strip() else '?'})")
            time.sleep(max(0.0, delay - (time.monotonic() - t_seen)))
            alive = p.poll() is None
            if alive:
                p.send_signal(signal.SIGKILL)
            p.stderr.read()
            p.wait()
            if not alive:
                say(f"  timed kill in phase {ph} +{delay * 1000:.0f} ms: the deploy had already ended (exit "
                    f"{p.returncode}); not counted")
                continue
            where_id, where = landed(dep)
            what = f"timed   phase {ph} ({PHASE_NAMES[ph]}) start +{delay * 1000:.0f} ms"
        else:
            _, q, op, match, n, why = step
            done = statuses(dep).get(q) in ("passed", "unverified") or os.path.exists(os.path.join(dep, "manifest.json"))
            if done:
                say(f"  (skipped: a kill inside {op} #{n} on {why}: phase {q} has already passed)")
                continue
            log = os.path.join(work, "killshim.log")
            if os.path.exists(log):
                os.remove(log)
            shim = {"TESSERA_KILLSHIM_DIR": dep, "TESSERA_KILLSHIM_OP": op, "TESSERA_KILLSHIM_MATCH": match,
                    "TESSERA_KILLSHIM_AT": str(n), "TESSERA_KILLSHIM_LOG": log}
            p = runner.start(dep, target, shim=shim)
            backstop = None
            for line in p.stderr:  # the shim should fire while phase q runs; if not, stop at the next
                started = phase_start(line)
                if started is not None and started > q:
                    backstop = started
                    p.send_signal(signal.SIGKILL)
                    break
            p.stderr.read()
            p.wait()
            if backstop is not None or p.returncode != -signal.SIGKILL:
                check(False, f"the kill inside {op} #{n} on {why} never happened in phase {q} (exit {p.returncode}"
                             f"{f', stopped as phase {backstop} started' if backstop is not None else ''})")
                continue
            inside = open(log).read().strip() if os.path.exists(log) else "?"
            where_id, where = landed(dep)
            what = f"in-{op:<6} #{n} on {why}: {inside.replace(dep + '/', '')}"
        temps = temporaries(dep) if os.path.isdir(dep) else []
        points.append(what)
        per_phase[where_id] = per_phase.get(where_id, 0) + 1
        say(f"kill {len(points):2d}: {what} -> died {where}; temporaries left: {', '.join(temps) or 'none'}")
        if os.path.isdir(dep):
            for b in whole_files_problems(dep):
                check(False, f"after kill {len(points)}: {b}")
            now = statuses(dep)
            lost = [p for p in ever_passed if now.get(p) not in ("passed", "unverified")]
            check(not lost, f"after kill {len(points)}: phases {lost} had passed and no longer have")
    r = runner.run(dep, target)
    say(f"final resume: exit {r.returncode}; kill chain and resumes {time.monotonic() - t_chain:.1f} s")
    if not check(r.returncode == 0 and "deployment ready" in r.stdout,
                 f"the resumed deployment did not pass (exit {r.returncode}): {r.stderr[-2000:]}"):
        return
    check("being deployed by another" not in r.stderr, "a stale lock was reported")
    check(not temporaries(dep), f"temporaries left: {temporaries(dep)}")
    for b in whole_files_problems(dep):
        check(False, b)
    rows, nfiles = compare_with_reference(ref, dep, args.tessera)
    timed = sum(1 for p in points if p.startswith("timed"))
    check(all(per_phase.get(p, 0) >= 1 for p in range(7)),
          f"not every phase 0-6 was killed in: kills per phase {dict(sorted(per_phase.items()))}")
    need = 8 if args.sanitized else 20
    check(len(points) >= need, f"only {len(points)} kill points (at least {need} wanted)")
    say(f"kill points: {len(points)} ({timed} timed, {len(points) - timed} inside a file operation); "
        f"kills per phase where they landed: " + ", ".join(f"{p if p >= 0 else 'before state.json'}: {per_phase[p]}"
                                                           for p in sorted(per_phase)))
    if failures:
        return
    say(f"the resumed deployment passes; {nfiles} files compared with the uninterrupted deploy, {rows} gate rows "
        f"identical, manifest matches (ignored: {', '.join(sorted(TIMING_KEYS))}, phase 6's measured "
        f"{'/'.join(sorted(SPEED_KEYS))}); no temporary left, every JSON parses")


# ---------------------------------------------------------------- private tmpfs (unshare -rm)

def in_namespace(args):
    """Re-runs this script inside a private user + mount namespace, or exits 77 with the reason."""
    if os.environ.get("TESSERA_CRASH_IN_NS") == "1":
        return
    if not shutil.which("unshare"):
        say("SKIP: no unshare(1) here: the full-disk and read-only checks need a private tmpfs mount")
        sys.exit(SKIP)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d "
                            "&& umount $d && rmdir $d"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        say(f"SKIP: a private tmpfs cannot be mounted here (unshare -rm: {probe.stdout.strip()})")
        sys.exit(SKIP)
    env = dict(os.environ, TESSERA_CRASH_IN_NS="1")
    r = subprocess.run(["unshare", "-rm", sys.executable, *sys.argv], env=env)
    sys.exit(r.returncode)


mounted = []


def mount(*a):
    subprocess.run(["mount", *a], check=True)
    if a[0] == "-t":  # a new mount (not a remount): unmounted at the end
        mounted.append(a[-1])


def one_error_line(stderr):
    lines = [l for l in stderr.splitlines() if l.strip()]
    return lines[0] if len(lines) == 1 else None


def mode_diskfull(args, work):
    model = synth_model(args, work)
    runner = Runner(args, model)
    mnt = os.path.join(work, "small")
    os.makedirs(mnt)
    size_k = 448  # phases 0-3 fit on the cpu target; the optimization phases' plans do not
    mount("-t", "tmpfs", "-o", f"size={size_k}k", "tessera-small", mnt)
    dep = os.path.join(mnt, "dep")
    r = runner.run(dep, "cpu", "--quiet")
    line = one_error_line(r.stderr)
    say(f"deploy into a {size_k} KiB tmpfs: exit {r.returncode}; stderr: {r.stderr.strip()}")
    check(r.returncode == 1, f"a full disk should exit 1, not {r.returncode}")
    check(line is not None, f"a full disk should give exactly one error line, got:\n{r.stderr}")
    if line:
        check(line.startswith("tessera: error: cannot write ") and "no space left on the device (ENOSPC)" in line
              and dep in line, f"the error should name the full disk (ENOSPC) and the file: {line}")
    st = statuses(dep)
    passed = [p for p in range(7) if st.get(p) in ("passed", "unverified")]
    first_open = min([p for p in range(7) if p not in passed], default=7)
    say(f"state after the full disk: {st}")
    check(passed == list(range(first_open)) and 1 <= first_open <= 6,
          f"phases before the full disk should have passed and a later one not: {st}")
    check(not temporaries(dep), f"temporaries left on the full disk: {temporaries(dep)}")
    for b in whole_files_problems(dep):
        check(False, f"on the full disk: {b}")
    before = snapshot(dep)
    records = {p: state(dep)["phases"][str(p)] for p in passed}
    mount("-o", "remount,size=64m", mnt)
    r = runner.run(dep, "cpu")
    say(f"resume after the tmpfs grew to 64 MiB: exit {r.returncode}")
    check(r.returncode == 0 and "deployment ready" in r.stdout, f"the resume did not complete: {r.stderr[-2000:]}")
    for p in passed:
        check(f"phase {p} {PHASE_NAMES[p]}: passed in an earlier run (resumed)" in r.stderr,
              f"phase {p} passed before the disk filled but was redone")
        check(state(dep)["phases"][str(p)] == records[p], f"phase {p}'s record changed on resume")
        f = f"phase{p}.json"
        check(snapshot(dep).get(f) == before.get(f), f"{f} changed on resume")
    check(not temporaries(dep), f"temporaries left: {temporaries(dep)}")
    if not failures:
        say(f"full disk: one error line, phases 0-{first_open - 1} intact and not redone, the resume completes")


def mode_readonly(args, work):
    model = synth_model(args, work)
    runner = Runner(args, model)
    mnt = os.path.join(work, "ro")
    os.makedirs(mnt)
    mount("-t", "tmpfs", "-o", "size=64m", "tessera-ro", mnt)
    dep = os.path.join(mnt, "dep")
    p = runner.start(dep, "cpu")  # phases 0-3, then killed as phase 4 starts
    for line in p.stderr:
        if phase_start(line) == 4:
            p.send_signal(signal.SIGKILL)
            break
    p.stderr.read()
    p.wait()
    st = statuses(dep)
    check(all(st.get(ph) == "passed" for ph in range(4)), f"phases 0-3 should have passed: {st}")
    before = snapshot(dep)
    mount("-o", "remount,ro", mnt)
    for extra in ([], ["--from-phase", "2"]):
        r = runner.run(dep, "cpu", "--quiet", *extra)
        line = one_error_line(r.stderr)
        say(f"deploy {' '.join(extra) or '(resume)'} on the read-only mount: exit {r.returncode}; stderr: {r.stderr.strip()}")
        check(r.returncode == 1, f"a read-only directory should exit 1, not {r.returncode}")
        check(line is not None and "read-only file system (EROFS)" in line and dep in line,
              f"one error line naming the read-only directory expected, got:\n{r.stderr}")
        check(snapshot(dep) == before, "the read-only deployment changed")
    mount("-o", "remount,rw", mnt)
    r = runner.run(dep, "cpu")
    say(f"resume once writable again: exit {r.returncode}")
    check(r.returncode == 0 and "deployment ready" in r.stdout, f"the resume did not complete: {r.stderr[-2000:]}")
    for ph in range(4):
        check(f"phase {ph} {PHASE_NAMES[ph]}: passed in an earlier run (resumed)" in r.stderr, f"phase {ph} was redone")
    if not failures:
        say("read-only: one error line each, nothing changed, the resume completes once writable")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["kill", "diskfull", "readonly"])
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--shim", required=True, help="the LD_PRELOAD library built from tests/killshim")
    ap.add_argument("--work", default=None, help="where the scratch directory goes (default: $TMPDIR)")
    ap.add_argument("--sanitized", action="store_true", help="a sanitizer build: a shorter kill list")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("TESSERA_CRASH_SEED", "20")))
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    if args.work:
        os.makedirs(args.work, exist_ok=True)
    if args.mode in ("diskfull", "readonly"):
        in_namespace(args)
    work = tempfile.mkdtemp(prefix=f"crash_{args.mode}_", dir=args.work)
    t0 = time.monotonic()
    try:
        {"kill": mode_kill, "diskfull": mode_diskfull, "readonly": mode_readonly}[args.mode](args, work)
    finally:
        for m in reversed(mounted):  # the namespace's tmpfs, before its mount point is removed
            subprocess.run(["umount", "-l", m])
        if not args.keep and not failures:
            shutil.rmtree(work, ignore_errors=True)
    say(f"{args.mode}: {time.monotonic() - t0:.1f} s, " + ("PASS" if not failures else f"{len(failures)} failure(s); kept {work}"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
