#!/usr/bin/env python3
"""Browser test of the deployment report (`tessera report`, DIR/report.html): headless Chromium
driven by selenium.

Usage: report_page_test.py TESSERA_BINARY [--shots DIR] [--keep DIR]
  (tests/report_page_test.sh runs it in the test clients' venv; ctest ReportPageE2E)

Deploys a tiny synthetic model on npusim and the default model (SmolLM2-135M-Instruct) on the
cpu, loads each deployment's report.html from disk (file://, so nothing could be fetched) and
checks: every chart (each [data-chart] element) holds one <svg> whose box is not empty and
whose marks (rect, line, circle, polyline) have a non-empty bounding box; the charts each
page should have are there; the browser logged no error; the page made no network request.
Saves a full-page screenshot of each (--shots DIR, default the work directory).
TESSERA_REPORT_E2E_TINY_ONLY=1 (the sanitizer builds): the tiny deploy only.
"""
import os
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


from headless_chromium import chrome  # noqa: E402 (exits 77 when Chromium or selenium is missing)

BIN = sys.argv[1]


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def tessera(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def browser(width=1200, height=900):
    return chrome(width, height, {"goog:loggingPrefs": {"browser": "ALL", "performance": "ALL"}})


# Every chart's box and the boxes of its marks, as the browser laid them out.
CHARTS_JS = """
return Array.from(document.querySelectorAll('[data-chart]')).map(c => {
  const svgs = c.querySelectorAll('svg');
  const s = svgs[0];
  const r = s ? s.getBoundingClientRect() : {width: 0, height: 0};
  let marks = 0, drawn = 0;
  if (s) for (const m of s.querySelectorAll('rect, line, circle, polyline')) {
    marks++;
    const b = m.getBBox();
    if (b.width > 0 || b.height > 0) drawn++;
  }
  return {name: c.getAttribute('data-chart'), svgs: svgs.length, w: r.width, h: r.height, marks: marks, drawn: drawn};
});
"""


def check_page(d, path, expected, shot):
    d.get("file://" + os.path.abspath(path))
    d.execute_script("return document.readyState")
    charts = d.execute_script(CHARTS_JS)
    names = {c["name"] for c in charts}
    for e in expected:
        check(e in names, f"{path}: chart {e} present")
    for c in charts:
        check(c["svgs"] == 1 and c["w"] > 50 and c["h"] > 30 and c["drawn"] > 3,
              f"{path}: chart {c['name']} renders ({c['w']:.0f}x{c['h']:.0f}, {c['drawn']}/{c['marks']} marks drawn)")
    errors = [e for e in d.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]
    check(not errors, f"{path}: no console error {errors[:3] if errors else ''}")
    requests = [e for e in d.get_log("performance") if '"Network.requestWillBeSent"' in e["message"]
                and '"url":"file://' not in e["message"] and '"url":"data:' not in e["message"]]
    check(not requests, f"{path}: no network request {requests[:1] if requests else ''}")
    # The whole page in one screenshot: the viewport as tall as the document.
    h = d.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                      {"width": 1200, "height": min(h, 16000), "deviceScaleFactor": 1, "mobile": False})
    d.save_screenshot(shot)
    check(os.path.getsize(shot) > 10000, f"screenshot {shot} ({os.path.getsize(shot)} bytes)")
    d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def main():
    work = arg("--keep") or tempfile.mkdtemp(prefix="tessera_report_page_")
    os.makedirs(work, exist_ok=True)
    shots = arg("--shots", work)
    os.makedirs(shots, exist_ok=True)
    tiny = os.path.join(work, "tiny")
    if not os.path.exists(os.path.join(tiny, "config.json")):
        rc, out, err = tessera("synth", "--preset", "SmolLM2-360M", "--tiny", "--out", tiny)
        check(rc == 0, f"synth a tiny model: {err.strip()[-200:]}")
    deps = [("npusim-tiny", [tiny, "--target", "npusim"],
             ["phase1-kernels", "phase3-layers", "phase3-layers-error", "phase3-positions", "phase4-trajectory",
              "phase5-trajectory", "npusim-prefill-timeline", "npusim-decode-timeline", "tile-map"]),
            ("cpu-default", ["--target", "cpu"],
             ["phase1-kernels", "phase3-layers", "phase3-layers-error", "phase3-positions", "phase4-trajectory",
              "phase5-trajectory", "cpu-decode-roof", "cpu-prefill-compute"])]
    if os.environ.get("TESSERA_REPORT_E2E_TINY_ONLY"):  # a sanitizer build: the default model is the Release run's
        deps = deps[:1]
    d = browser()
    try:
        for name, args, expected in deps:
            out_dir = os.path.join(work, name)
            rc, out, err = tessera("deploy", *args, "--out", out_dir, "--quiet")
            check(rc == 0, f"deploy {name} (exit {rc}) {err.strip()[-300:]}")
            page = os.path.join(out_dir, "report.html")
            check(os.path.exists(page), f"{page} written by deploy")
            if os.path.exists(page):
                check_page(d, page, expected, os.path.join(shots, f"report_{name}.png"))
    finally:
        d.quit()
    if not arg("--keep"):
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
