"""Recovery of elastic DDP without restarts (examples/python/ddp_elastic.py: torch DDP
over the elasticrun backend, elasticrun.torch.elastic.run): the time from the SIGKILL
of one worker, inside its backward(), to the end of the survivors' next training step.
Everything the survivors do in between counts: their failed allreduce, the restore, the
re-join, the new process group (a TCPStore and torch's start-up barrier), the sync of
the state, the new DDP wrapper (which broadcasts the model again) and the step itself.

    /usr/bin/python3 bench/elastic_ddp_bench.py [--runs 5] [--np 2 4]

One worker per loopback host (localhost, 127.0.0.2, ...); the last host's worker kills
itself at step 10 of 30. Prints every run's figure, the median per worker count, and the
step time before the kill for scale. Exit status 1 if a run fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("ELASTICRUN_BUILD", ROOT / "build"))
PYTHON = "/usr/bin/python3"
EXAMPLE = ROOT / "examples" / "python" / "ddp_elastic.py"
KILL_AT, STEPS = 10, 30


def one_run(n, step_ms):
    hosts = ["localhost"] + [f"127.0.0.{i}" for i in range(2, n + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = tmp / "out"
        cmd = [str(BUILD / "cmd" / "elasticrun"), "-x", "PYTHONPATH", "--min-np", "1", "--max-np", str(n),
               "-H", ",".join(f"{h}:1" for h in hosts), PYTHON, str(EXAMPLE), "--steps", str(STEPS),
               "--batch", "12", "--out", str(out), "--kill-at", str(KILL_AT), "--kill-host", hosts[-1],
               "--step-ms", str(step_ms)]
        env = dict(os.environ, PYTHONPATH=str(BUILD / "python"))
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            return None, f"rc {p.returncode}: {p.stderr[-1500:]}"
        killed = float((out / "marks" / "killed_at").read_text())
        times = json.loads((out / "times.json").read_text())
        after = [t for _, t, _ in times if t > killed]
        before = [t for _, t, _ in times if t <= killed]
        step = statistics.median(b - a for a, b in zip(before, before[1:])) if len(before) > 2 else float("nan")
        return (after[0] - killed, step), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--np", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--step-ms", type=float, default=20, help="sleep per step (the example's --step-ms)")
    args = ap.parse_args()
    print(f"examples/python/ddp_elastic.py, kill at step {KILL_AT} of {STEPS}, --step-ms {args.step_ms}; "
          f"seconds from the kill to the end of the next step")
    print(f"{'workers':>7} {'median s':>9} {'step s':>7}  runs")
    failed = False
    for n in args.np:
        got, steps = [], []
        for _ in range(args.runs):
            res, err = one_run(n, args.step_ms)
            if err:
                print(f"FAILED at {n} workers: {err}", flush=True)
                failed = True
                continue
            got.append(res[0])
            steps.append(res[1])
        if got:
            print(f"{n:>7} {statistics.median(got):>9.3f} {statistics.median(steps):>7.3f}  "
                  + " ".join(f"{g:.3f}" for g in got), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
