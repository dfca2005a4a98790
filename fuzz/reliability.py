#!/usr/bin/env python3
"""Writes docs/reliability.md (to stdout) from the campaign record fuzz/campaign.tsv, which
fuzz/run.sh HOURS appends one line per harness run to, and fuzz/findings.md.

    python3 fuzz/reliability.py fuzz/campaign.tsv fuzz/findings.md > docs/reliability.md

A harness's campaign is the sum of its runs (each run starts from the corpus the earlier ones
kept in build-fuzz/fuzz-corpus/); the goal is 10 million executions or one hour in all."""
import csv
import os
import sys

GOAL_EXECS, GOAL_SECONDS = 10_000_000, 3600


def num(v):
    try:
        return int(v)
    except ValueError:
        return None


def main():
    record, findings = sys.argv[1], sys.argv[2]
    rows = list(csv.DictReader(open(record), delimiter="\t"))
    # Every harness in fuzz/ (fuzz_<name>.cc beside this script), run or not, and any in the record.
    here = os.path.dirname(os.path.abspath(__file__))
    sources = {f[len("fuzz_"):-len(".cc")] for f in os.listdir(here) if f.startswith("fuzz_") and f.endswith(".cc")}
    harnesses = sorted(sources | {r["harness"] for r in rows})
    out = ["# Reliability: the fuzz campaign", ""]
    out.append("Written by `fuzz/reliability.py` from `fuzz/campaign.tsv`, the record `fuzz/run.sh HOURS` appends "
               "one line per harness run to. Every run: libFuzzer with ASan + UBSan, -O1 -g1, -timeout=1 "
               "-rss_limit_mb=2048 -malloc_limit_mb=2048, from the seeds in fuzz/corpus/ and what earlier runs "
               "kept in build-fuzz/fuzz-corpus/; a run stops at 10 million executions or its time limit. Edges "
               "are libFuzzer's `cov` (coverage edges reached), features its `ft`, both as the latest run ended. "
               f"Goal per harness: {GOAL_EXECS:,} executions or {GOAL_SECONDS // 60} minutes in all.")
    out += ["", "| harness | runs | seconds in all | executions in all | edges | features | crashing inputs | goal |",
            "|---|---|---|---|---|---|---|---|"]
    reached = 0
    for h in harnesses:
        rs = [r for r in rows if r["harness"] == h]
        if not rs:
            out.append(f"| {h} | 0 | 0 | 0 | - | - | 0 | not yet (no campaign run) |")
            continue
        secs = sum(num(r["seconds"]) or 0 for r in rs)
        execs = sum(num(r["executions"]) or 0 for r in rs)
        crashes = sum(num(r["crashing_inputs"]) or 0 for r in rs)
        ok = execs >= GOAL_EXECS or secs >= GOAL_SECONDS
        reached += ok
        out.append(f"| {h} | {len(rs)} | {secs} | {execs:,} | {rs[-1]['edges']} | {rs[-1]['features']} | {crashes} | "
                   f"{'reached' if ok else 'not yet'} |")
    out += ["", f"{reached} of {len(harnesses)} harnesses have reached the goal.", "", "## Every run", "",
            "| date (UTC) | harness | seconds | executions | edges | features | crashing inputs | status | machine |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| " + " | ".join(r[k] for k in ("date", "harness", "seconds", "executions", "edges", "features",
                                                   "crashing_inputs", "status", "machine")) + " |")
    out.append("")
    print("\n".join(out))
    print(open(findings).read(), end="")


if __name__ == "__main__":
    main()
