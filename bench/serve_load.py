#!/usr/bin/env python3
"""Serving under load: tessera serve against llama.cpp's llama-server, same run.

  bench/serve_load.py [MODEL.gguf] [--streams N] [--requests R] [--prompt-chars C]
                      [--max-tokens M] [--threads T] [--rounds K] [--tessera BIN]
                      [--llama-server BIN] [--json FILE]

Both servers load the same GGUF file with the same threads and N slots (tessera
--parallel N; llama-server --parallel N, continuous batching on, N times the per-slot
context). Each round sends the same load to one server, then the other: N client threads,
each sending R streamed /v1/completions requests one after another (temperature 0,
ignore_eos, M tokens; every request of every round its own slice of a text that ships with
Debian, so no request reuses another's prefix, not even one from an earlier round). Per server and round: generated tokens per second of
wall time over all streams, time to first token (median, p90) and inter-token latency (median, p99,
from the SSE chunks' arrival). The table gives each side's median over the rounds and the
per-round ratios tessera / llama.cpp (> 1: tessera ahead; latencies: llama.cpp / tessera).
llama-server is built by bench/llama_cpp_build.sh (llama-cpp-python's vendored llama.cpp).
Python only drives the load: both servers are the programs users run.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "/usr/share/common-licenses/GPL-3"


def say(msg):
    print(f"serve_load: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, name, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"serve_load: {name} exited with {proc.returncode} before it was ready")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"serve_load: {name} was not ready after {timeout} s")


def one_request(port, prompt, max_tokens):
    """A streamed completion; returns (tokens, ttft_s, [inter-token gaps], total_s)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    arrivals, usage = [], None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        if any(ch.get("text") for ch in chunk.get("choices", [])):
            arrivals.append(time.perf_counter())
    total = time.perf_counter() - t0
    c.close()
    tokens = usage["completion_tokens"] if usage else len(arrivals)
    ttft = (arrivals[0] - t0) if arrivals else total
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return tokens, ttft, gaps, total


def run_load(port, prompts, streams, requests, max_tokens):
    results, errors = [], []
    lock = threading.Lock()

    def client(i):
        for j in range(requests):
            try:
                res = one_request(port, prompts[(i * requests + j) % len(prompts)], max_tokens)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 -- reported, counted, never hidden
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    ttfts = sorted(r[1] for r in results)
    gaps = sorted(g for r in results for g in r[2])

    def pct(v, q):
        return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")

    return {"tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall, "requests": len(results),
            "errors": errors, "ttft_median_s": pct(ttfts, 0.5), "ttft_p90_s": pct(ttfts, 0.9),
            "itl_median_s": pct(gaps, 0.5), "itl_p99_s": pct(gaps, 0.99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--streams", type=int, default=4, help="concurrent clients, and slots on each server")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    ap.add_argument("--prompt-chars", type=int, default=600, help="characters of text per prompt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build/tessera"))
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if not a.model.endswith(".gguf") or not os.path.isfile(a.model):
        raise SystemExit(f"serve_load: {a.model}: a GGUF file is needed (both servers load the same file)")
    llama = a.llama_server
    if not llama:
        bin_dir = subprocess.run([os.path.join(ROOT, "bench/llama_cpp_build.sh")], check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
        llama = os.path.join(bin_dir, "llama-server")
    text = open(TEXT, encoding="utf-8").read()
    # Every request of every round (and the warm-up) its own slice: a server that keeps past
    # prompts' caches (llama-server does) must not answer a later round from them.
    n_prompts = a.streams * a.requests
    total = n_prompts * a.rounds + 1
    step = max(1, (len(text) - a.prompt_chars) // total)
    slices = [text[i * step:i * step + a.prompt_chars] for i in range(total)]
    warm_up = slices[-1:]
    per_slot_ctx = 2048

    tp, lp = free_port(), free_port()
    servers = {
        "tessera": subprocess.Popen([a.tessera, "serve", a.model, "--port", str(tp), "--parallel", str(a.streams),
                                     "--threads", str(a.threads), "--ctx-size", str(per_slot_ctx)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "llama.cpp": subprocess.Popen([llama, "-m", a.model, "--port", str(lp), "--parallel", str(a.streams),
                                       "-t", str(a.threads), "-tb", str(a.threads),
                                       "-c", str(per_slot_ctx * a.streams), "--cont-batching"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    }
    ports = {"tessera": tp, "llama.cpp": lp}
    try:
        for name, p in servers.items():
            wait_healthy(ports[name], p, name)
        say(f"{os.path.basename(a.model)}: {a.streams} streams x {a.requests} requests, {a.max_tokens} tokens each, "
            f"{a.threads} threads, {a.rounds} rounds")
        for name in servers:  # warm-up: first touches of the weights are not serving speed
            run_load(ports[name], warm_up, 1, 1, 8)
        rounds = {"tessera": [], "llama.cpp": []}
        for r in range(a.rounds):
            prompts = slices[r * n_prompts:(r + 1) * n_prompts]  # the same load for both servers
            for name in ("llama.cpp", "tessera"):
                res = run_load(ports[name], prompts, a.streams, a.requests, a.max_tokens)
                if res["errors"]:
                    raise SystemExit(f"serve_load: {name}: {len(res['errors'])} requests failed: {res['errors'][0]}")
                rounds[name].append(res)
                say(f"round {r + 1}/{a.rounds}: {name:9s} {res['tokens_per_s']:8.1f} tok/s, "
                    f"TTFT {res['ttft_median_s'] * 1e3:.0f} ms, ITL {res['itl_median_s'] * 1e3:.1f} ms")
    finally:
        for p in servers.values():
            p.terminate()
        for p in servers.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    def med(name, key):
        return statistics.median(x[key] for x in rounds[name])

    rows = []
    for key, label, higher_better in (("tokens_per_s", "generated tok/s (all streams)", True),
                                      ("ttft_median_s", "time to first token, median (s)", False),
                                      ("ttft_p90_s", "time to first token, p90 (s)", False),
                                      ("itl_median_s", "inter-token latency, median (s)", False),
                                      ("itl_p99_s", "inter-token latency, p99 (s)", False)):
        per = [(t[key] / l[key]) if higher_better else (l[key] / t[key])
               for t, l in zip(rounds["tessera"], rounds["llama.cpp"])]
        rows.append({"metric": label, "tessera": med("tessera", key), "llama_cpp": med("llama.cpp", key),
                     "ratio": statistics.median(per), "round_ratios": per})
    print(f"model      {a.model}\nload       {a.streams} streams x {a.requests} requests, {a.prompt_chars} characters "
          f"in, {a.max_tokens} tokens out, {a.threads} threads, {a.rounds} rounds\n")
    print(f"{'metric':34s} | {'tessera':>9s} | {'llama.cpp':>9s} | {'ratio':>6s} | per-round ratios")
    for row in rows:
        print(f"{row['metric']:34s} | {row['tessera']:9.3f} | {row['llama_cpp']:9.3f} | {row['ratio']:6.2f} | "
              + " ".join(f"{x:.2f}" for x in row["round_ratios"]))
    print("(ratio: tessera / llama.cpp for tokens/s, llama.cpp / tessera for latencies: > 1, tessera ahead)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "streams": a.streams, "requests": a.requests, "max_tokens": a.max_tokens,
                       "prompt_chars": a.prompt_chars, "threads": a.threads, "rows": rows, "rounds": rounds}, f,
                      indent=2)


if __name__ == "__main__":
    main()
