"""The same allreduce over and over for a while: how much one machine's speed drifts.

    /usr/bin/python3 bench/allreduce_drift.py [--np 2] [--bytes 4M] [--seconds 20] [--batch 100]

Runs --np ranks on this host under build/cmd/elasticrun; every rank calls
elasticrun.allreduce (f32 sum, out of place) in batches of --batch calls, all ranks the
same number of batches (rank 0 decides when to stop and tells the others, so that no
rank waits on one that has left). Prints the median call of every batch in order, then
a summary: the fastest and slowest batch, the quartiles, and the share of batches more
than twice as slow as the fastest quarter's. A machine whose figures drift between
spells (a virtual machine whose cores the host moves around) shows it here, before a
ratio measured on it is believed; benchmarks there need interleaved repeats and medians.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("ELASTICRUN_BUILD", ROOT / "build"))
PYTHON = "/usr/bin/python3"


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    scale = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    if not number.isdigit() or int(number) * scale < 4:
        raise argparse.ArgumentTypeError(f"not a byte count of at least 4: '{text}'")
    return int(number) * scale


def worker(args):
    import numpy as np
    import elasticrun
    elasticrun.init()
    a = np.ones(args.bytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    go = np.zeros(1, dtype=np.int32)
    end = time.monotonic() + args.seconds
    medians = []
    while True:
        go[0] = 1 if elasticrun.rank() != 0 or time.monotonic() < end else 0
        elasticrun.allreduce(go, out=go, op=elasticrun.Min)
        if go[0] == 0:
            break
        times = []
        for _ in range(args.batch):
            t0 = time.perf_counter()
            elasticrun.allreduce(a, out=b)
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times) * 1e6)
    if b[0] != elasticrun.size():
        sys.exit(f"allreduce_drift: wrong result {b[0]}, expected {elasticrun.size()}")
    if elasticrun.rank() == 0:
        print("batch medians (us):", " ".join(f"{m:.0f}" for m in medians))
        q = statistics.quantiles(medians, n=4) if len(medians) >= 2 else [medians[0]] * 3
        fast = q[0]
        slow = sum(m > 2 * fast for m in medians)
        print(f"{len(medians)} batches of {args.batch} calls, {args.bytes} B, {elasticrun.size()} ranks: "
              f"fastest {min(medians):.0f} us, quartiles {q[0]:.0f} / {q[1]:.0f} / {q[2]:.0f} us, "
              f"slowest {max(medians):.0f} us; {slow} of {len(medians)} batches more than twice the first quartile")
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--bytes", type=size_of, default=4 << 20)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.np < 1 or args.batch < 1 or args.seconds <= 0:
        ap.error("--np and --batch must be at least 1, --seconds above 0")
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, PYTHONPATH=str(BUILD / "python"))
    cmd = [str(BUILD / "cmd" / "elasticrun"), "-np", str(args.np), "-x", "PYTHONPATH",
           PYTHON, __file__, "--worker", "--bytes", str(args.bytes), "--seconds", str(args.seconds), "--batch",
           str(args.batch)]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
