#!/usr/bin/python3
"""What durable checkpoints (elasticrun --checkpoint-dir) cost and what they buy.

    bench/durable_bench.py [--runs 5] [--steps 300] [--dim 65536] [--build build]

1. Step time of elastic_sgd (2 workers on loopback hosts, a commit after every step, an
   int64 model of --dim entries: 512 KiB by default) without checkpoints, with one every
   10 commits (K = 10) and with one at every commit (K = 1), in interleaved runs. The
   training time of a run is read from its --events (the first epoch formed to the last
   worker's exit), so process start-up is not in it. Medians, and the ratios against no
   checkpoints in the same runs.
2. Recovery: the time from SIGKILL to rank 0's first commit afterwards, (a) when both
   workers are killed at once (total loss: new workers on the two spare hosts restore
   the newest checkpoint) and (b) when one of the two is killed (the survivor keeps the
   state; a new worker is started beside it), with a checkpoint every 10 commits.

Prints markdown tables for bench/RESULTS.md."""
import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOSTS4 = "localhost:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"


def sgd(o, *extra):
    return [str(Path(o.build) / "examples" / "elastic_sgd"), "--dim", str(o.dim), "--batch", "32", "--commit-every",
            "1", *map(str, extra)]


def elasticrun(o):
    return str(Path(o.build) / "cmd" / "elasticrun")


def training_seconds(events):
    ev = [json.loads(l) for l in Path(events).read_text().splitlines()]
    start = next(e["t"] for e in ev if e["event"] == "epoch_joined")
    end = max(e["t"] for e in ev if e["event"] == "worker_exited")
    return end - start


def step_time(o, k, tmp):
    ev = tmp / f"ev-{k}-{time.monotonic_ns()}"
    args = [elasticrun(o), "-np", "2", "-H", "localhost:1,127.0.0.2:1", "--events", str(ev)]
    if k:
        ck = tmp / f"ck-{k}-{time.monotonic_ns()}"
        args += ["--checkpoint-dir", str(ck), "--checkpoint-every", str(k), "--checkpoint-interval", "0"]
    r = subprocess.run(args + sgd(o, "--steps", o.steps), capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"durable_bench: a run failed:\n{r.stderr[-2000:]}")
    return training_seconds(ev) / o.steps * 1000


def workers(tag, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if not (p / "cmdline").read_bytes().split(b"\0")[0].endswith(b"/elastic_sgd"):
                    continue
                if f"ER_BENCH_TAG={tag}".encode() in (p / "environ").read_bytes():
                    found.append(int(p.name))
            except OSError:
                pass
        if len(found) >= n:
            return found
        time.sleep(0.01)
    raise SystemExit("durable_bench: the workers did not start")


def recovery(o, kill_both, tmp):
    """Seconds from the SIGKILL to rank 0's first commit line after it."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    ck = tmp / f"ck-rec-{tag}"
    env = dict(os.environ, ER_BENCH_TAG=tag)
    p = subprocess.Popen([elasticrun(o), "-x", "ER_BENCH_TAG", "-np", "2", "--min-np", "2", "--max-np", "2", "-H",
                          HOSTS4, "--checkpoint-dir", str(ck), "--checkpoint-every", "10", *sgd(o, "--steps", 100000,
                                                                                                 "--step-ms", 2)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    lines = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), l)) for l in p.stdout], daemon=True)
    reader.start()
    pids = workers(tag, 2)
    while not any(c.name.startswith("commit-") for c in ck.iterdir()) if ck.exists() else True:
        time.sleep(0.01)
    time.sleep(0.2)
    killed = time.monotonic()
    for pid in (pids if kill_both else pids[1:]):
        os.kill(pid, signal.SIGKILL)
    # The first commit of a later epoch than any seen before the kill: a line of the old
    # workers forwarded late is not it.
    before = max(int(l.split(" epoch ")[1]) for t, l in list(lines) if t <= killed and "committed step" in l)
    deadline = killed + 60
    first = None
    while first is None and time.monotonic() < deadline:
        first = next((t for t, l in list(lines) if "committed step" in l and int(l.split(" epoch ")[1]) > before),
                     None)
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    if first is None:
        raise SystemExit("durable_bench: no commit within 60 s of the kill")
    return first - killed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dim", type=int, default=65536)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--only", choices=["steps", "recovery"], help="run one part")
    o = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="durable-bench-") as d:
        tmp = Path(d)
        times = {0: [], 10: [], 1: []}
        for run in range(o.runs if o.only != "recovery" else 0):
            order = [0, 10, 1] if run % 2 == 0 else [1, 10, 0]
            for k in order:
                times[k].append(step_time(o, k, tmp))
            print(f"run {run}: " + "  ".join(f"K={k or '-'} {times[k][-1]:.3f} ms" for k in (0, 10, 1)), flush=True)
        rec = {"total": [], "one": []}
        for run in range(o.runs if o.only != "steps" else 0):
            for kind in ("total", "one") if run % 2 == 0 else ("one", "total"):
                rec[kind].append(recovery(o, kind == "total", tmp))
            print(f"recovery run {run}: total loss {rec['total'][-1]:.3f} s, one worker {rec['one'][-1]:.3f} s",
                  flush=True)
    if o.only != "recovery":
        print_steps(o, times)
    if o.only != "steps":
        print_recovery(rec)


def print_steps(o, times):
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nelastic_sgd, 2 workers, --dim {o.dim} ({o.dim * 8 // 1024} KiB of state), a commit every step, "
          f"{o.steps} steps; medians of {o.runs} interleaved runs\n")
    print("| checkpoints | step ms (median) | min | max | ratio to none |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k, name in ((0, "none"), (10, "every 10 commits"), (1, "every commit")):
        print(f"| {name} | {med[k]:.3f} | {min(times[k]):.3f} | {max(times[k]):.3f} | {med[k] / med[0]:.3f} |")


def print_recovery(rec):
    print("\n| SIGKILL of | to rank 0's first commit after it, s (median) | min | max |")
    print("| --- | ---: | ---: | ---: |")
    for kind, name in (("total", "both workers (restore from the checkpoint)"), ("one", "one worker of two")):
        print(f"| {name} | {statistics.median(rec[kind]):.3f} | {min(rec[kind]):.3f} | {max(rec[kind]):.3f} |")


if __name__ == "__main__":
    main()
