#!/usr/bin/python3
"""Recovery of an unmodified DDP script in restart mode: elasticrun --max-restarts, with and
without --preload, against torchrun, same script, same kill.

    /usr/bin/python3 bench/restart_bench.py [--runs 5] [--np 2 4] [--build build]
                                            [--monitor-interval 5] [--step-ms 50]

For each launcher and worker count, --runs times, interleaved: start
examples/python/ddp_torchrun.py (gloo, env://, a checkpoint at every step) on this machine
with --np workers and 3 restarts allowed; once rank 1 has done step 10, SIGKILL it; the
recovery is the time from the kill to the first step of the new generation (the earliest
"step ... restart 1" line of any rank, stamped by the worker's wall clock). Rank 1's pid is
the one its start line prints (with --preload, /proc/PID/environ of every worker is the
fork server's). Then the job is interrupted (SIGTERM) and the next run starts. Prints a
markdown table: the median and every sample per launcher, and the ratios against
torchrun (the target: 0.5 or less).

elasticrun: `elasticrun -np N --max-restarts 3 /usr/bin/python3 ddp_torchrun.py ...`.
elasticrun --preload: the same with `--preload torch,torch.distributed`: each host's fork
server imports torch once, and every generation's workers are its forks.
torchrun: Debian's `/usr/bin/python3 -m torch.distributed.run --standalone
--nproc_per_node N --max_restarts 3 --monitor_interval M` (M: --monitor-interval, torchrun's
default 5 s unless given). Under Python 3.11, torch 1.13's torchrun crashes in to_map:
Std.from_str returns None for the default --redirects/--tee "0" (Python 3.11 no longer
iterates over a flag's zero member); it runs here through a wrapper that maps that None
to Std.NONE, changing nothing else.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "/usr/bin/python3"
SCRIPT = ROOT / "examples" / "python" / "ddp_torchrun.py"
KILL_AFTER_STEP = 10
LAUNCHERS = ("elasticrun", "elasticrun --preload", "torchrun")
PRELOAD = "torch,torch.distributed"

TORCHRUN_WRAPPER = '''\
# torchrun with torch 1.13's Std.from_str fixed for Python 3.11 (see bench/restart_bench.py).
import sys
import torch.distributed.elastic.multiprocessing.api as api
from_str = api.Std.from_str


def fixed(vm):
    got = from_str(vm)
    if isinstance(got, dict):
        return {k: api.Std.NONE if v is None else v for k, v in got.items()}
    return api.Std.NONE if got is None else got


api.Std.from_str = staticmethod(fixed)
from torch.distributed.run import main
sys.exit(main())
'''


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--np", type=int, nargs="+", default=[2, 4])
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--monitor-interval", type=float, default=5.0, help="torchrun's --monitor_interval (its default: 5)")
    p.add_argument("--step-ms", type=float, default=50)
    p.add_argument("--timeout", type=float, default=120, help="seconds a run may take before it is given up")
    o = p.parse_args()
    if o.runs < 1 or any(n < 2 for n in o.np):
        p.error("--runs must be at least 1 and every --np at least 2")
    return o


def command(o, launcher, n, workdir, wrapper):
    script = [str(SCRIPT), "--checkpoint", str(workdir / "ck.pt"), "--steps", "1000000", "--step-ms", str(o.step_ms),
              "--print-steps"]
    if launcher.startswith("elasticrun"):
        preload = ["--preload", PRELOAD] if launcher.endswith("--preload") else []
        return [str(Path(o.build).resolve() / "cmd" / "elasticrun"), "-np", str(n), "--max-restarts", "3", *preload, PYTHON,
                *script]
    return [PYTHON, str(wrapper), "--standalone", "--nproc_per_node", str(n), "--max_restarts", "3",
            "--monitor_interval", str(o.monitor_interval), *script]


def processes(tag):
    """(pid, environ) of the live processes carrying this run's tag."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"ER_BENCH_TAG={tag}".encode() in env and state != "Z":
            out.append((int(d.name), env.split(b"\0")))
    return out


def one_run(o, launcher, n, wrapper):
    """Seconds from the SIGKILL of rank 1 to the first step of the next generation."""
    tag = uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        env = dict(os.environ, ER_BENCH_TAG=tag)
        p = subprocess.Popen(command(o, launcher, n, Path(tmp), wrapper), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp, start_new_session=True)
        state = {"killed_at": None, "recovered_at": None, "rank_1": None}
        ready = threading.Event()
        done = threading.Event()

        def read():
            for line in p.stdout:
                start = re.search(r"ddp: rank 1 .* restart 0 port \d+ pid (\d+)", line)
                if start:
                    state["rank_1"] = int(start.group(1))
                m = re.search(r"ddp: step (\d+) rank (\d+) restart (\d+) t=([\d.]+)", line)
                if not m:
                    continue
                step, rank, restart, t = int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
                if restart == 0 and rank == 1 and step >= KILL_AFTER_STEP:
                    ready.set()
                if restart == 1 and state["recovered_at"] is None:
                    state["recovered_at"] = t
                    done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            if not ready.wait(o.timeout):
                raise RuntimeError(f"{launcher}: rank 1 did not reach step {KILL_AFTER_STEP}")
            pid = state["rank_1"]
            if pid is None:
                raise RuntimeError(f"{launcher}: no worker of rank 1 found")
            state["killed_at"] = time.time()
            os.kill(pid, signal.SIGKILL)
            if not done.wait(o.timeout):
                raise RuntimeError(f"{launcher}: no step of a new generation within {o.timeout} s")
            return state["recovered_at"] - state["killed_at"]
        finally:
            stop(p, tag)


def stop(p, tag):
    """Interrupts the launcher (it stops its workers), then kills whatever of the run is left."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    deadline = time.monotonic() + 5
    while processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main():
    o = parse()
    if not (Path(o.build) / "cmd" / "elasticrun").exists():
        sys.exit(f"restart_bench: no {o.build}/cmd/elasticrun (build first, or give --build)")
    with tempfile.TemporaryDirectory(prefix="restart-bench-wrapper-") as wd:
        wrapper = Path(wd) / "torchrun_py311.py"
        wrapper.write_text(TORCHRUN_WRAPPER)
        samples = {}
        for n in o.np:
            for run in range(o.runs):
                for launcher in LAUNCHERS:
                    s = one_run(o, launcher, n, wrapper)
                    samples.setdefault((launcher, n), []).append(s)
                    print(f"# np {n} run {run + 1}/{o.runs} {launcher}: {s:.3f} s", file=sys.stderr, flush=True)
    print(f"Recovery from SIGKILL of rank 1 to the first step of the next generation, seconds "
          f"(median of {o.runs}; torchrun --monitor_interval {o.monitor_interval:g}; --step-ms {o.step_ms:g})\n")
    print("| workers | elasticrun --max-restarts | with --preload | torchrun | elasticrun / torchrun | --preload / torchrun "
          "| elasticrun samples | --preload samples | torchrun samples |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)
    for n in o.np:
        e, f, t = (samples[(launcher, n)] for launcher in LAUNCHERS)
        me, mf, mt = statistics.median(e), statistics.median(f), statistics.median(t)
        print(f"| {n} | {me:.2f} | {mf:.2f} | {mt:.2f} | {me / mt:.2f} | {mf / mt:.2f} | {fmt(e)} | {fmt(f)} | {fmt(t)} |")


if __name__ == "__main__":
    main()
