#!/usr/bin/python3
"""The cost of the Python layer: the same allreduce from Python (elasticrun's numpy API,
and a torch tensor through elasticrun.torch where it is built) and from C++
(allreduce_bench), same ranks, same machine, same run, alternating trials; and
torch.distributed's all_reduce over the backend "elasticrun".

    /usr/bin/python3 bench/python_overhead.py [--ranks 2] [--trials 3] [--build build]

Timing as allreduce_bench does it: batches of back-to-back calls after a barrier, the
median per-call time over batches, the max over ranks; each trial's figure is then the
median over trials. Prints a table: C++ time, Python time, the difference (8 bytes:
target within 2 us) and the ratio (64 MiB: target within 5%). Exits 1 when a Python
result was wrong or a run failed.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"8 B": 8, "64 MiB": 64 << 20}


def measure(call, barrier, nbytes):
    """Median per-call microseconds over batches (allreduce_bench's sweep)."""
    iters = 2000 if nbytes <= 4096 else max(3, min(200, (1 << 30) // nbytes))
    per_batch = max(1, iters // 100)
    samples = max(1, iters // per_batch)
    for _ in range(min(20, max(1, iters // 5))):
        call()
    per_call = []
    for _ in range(samples):
        barrier()
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call()
        per_call.append((time.perf_counter() - t0) * 1e6 / per_batch)
    return statistics.median(per_call)


def worker():
    import numpy as np
    import elasticrun as er
    er.init()
    n = er.size()

    def max_over_ranks(v):
        a = np.array([v], dtype=np.float64)
        er.allreduce(a, op=er.Max, out=a)
        return float(a[0])

    rows = []
    for label, nbytes in SIZES.items():
        # Out of place into a preallocated output, as allreduce_bench calls it.
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        for check in (True, False):
            er.set_shape_check(check)
            t = measure(lambda: er.allreduce(x, op=er.Sum, out=out), er.barrier, nbytes)
            rows.append((f"numpy{'' if check else ' unchecked'}", label, max_over_ranks(t)))
        t = measure(lambda: er.allreduce(x, op=er.Sum, out=x), er.barrier, nbytes)
        rows.append(("numpy in place", label, max_over_ranks(t)))
        er.set_shape_check(True)
        y = np.ones(nbytes // 4, dtype=np.float32)
        er.allreduce(y, op=er.Sum, out=y)
        assert np.all(y == n), "wrong numpy result"
        try:
            import torch
            import elasticrun.torch as hvd
        except ImportError:
            continue
        tt = torch.ones(nbytes // 4, dtype=torch.float32)
        t = measure(lambda: hvd.allreduce_(tt, op=hvd.Sum), er.barrier, nbytes)
        rows.append(("torch allreduce_ (in place)", label, max_over_ranks(t)))
        tt.fill_(1)
        hvd.allreduce_(tt, op=hvd.Sum)
        assert bool((tt == n).all()), "wrong torch result"
        # torch.distributed over the backend "elasticrun" (MASTER_ADDR/PORT, RANK and
        # WORLD_SIZE come from the driver, as under torchrun).
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("elasticrun")
        t = measure(lambda: dist.all_reduce(tt), er.barrier, nbytes)
        rows.append(("torch.distributed all_reduce", label, max_over_ranks(t)))
        tt.fill_(1)
        dist.all_reduce(tt)
        assert bool((tt == n).all()), "wrong torch.distributed result"
    if er.rank() == 0:
        for impl, label, t in rows:
            print(f"ROW,{impl},{label},{t:.4f}", flush=True)
    er.shutdown()


def run(cmd, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    o = p.parse_args()
    if o.worker:
        worker()
        return 0
    build = Path(o.build)
    launcher = build / "cmd" / "elasticrun"
    env = dict(os.environ, PYTHONPATH=str(build / "python"))
    results = {}
    failures = []
    for trial in range(o.trials):
        for label, nbytes in SIZES.items():
            try:
                out = run([launcher, "-np", o.ranks, build / "bench" / "allreduce_bench", "--min-bytes", nbytes,
                           "--max-bytes", nbytes, "--csv"])
                fields = [l.split(": ", 1)[1].split(",") for l in out.splitlines() if "elasticrun," in l]
                if not fields or fields[0][10] != "yes":
                    failures.append(f"trial {trial}: allreduce_bench {label}: {out[-500:]}")
                    continue
                results.setdefault(("C++ allreduce_bench", label), []).append(float(fields[0][7]))
            except RuntimeError as e:
                failures.append(f"trial {trial}: {e}")
        try:
            out = run([launcher, "-np", o.ranks, "-x", "PYTHONPATH", sys.executable, __file__, "--worker"], env=env)
            for line in out.splitlines():
                if "ROW," in line:
                    _, impl, label, t = line.split(": ", 1)[1].split(",")
                    results.setdefault((impl, label), []).append(float(t))
        except RuntimeError as e:
            failures.append(f"trial {trial}: {e}")

    print(f"# allreduce of float32, {o.ranks} ranks on this host, median over {o.trials} trials of the median call")
    print(f"# {'implementation':<28} {'size':>7} {'time_us':>12} {'minus C++ us':>13} {'ratio to C++':>13}")
    for label in SIZES:
        base = results.get(("C++ allreduce_bench", label))
        base_t = statistics.median(base) if base else None
        for (impl, lab), ts in sorted(results.items(), key=lambda kv: kv[0][0]):
            if lab != label:
                continue
            t = statistics.median(ts)
            diff = f"{t - base_t:13.3f}" if base_t else f"{'-':>13}"
            ratio = f"{t / base_t:13.3f}" if base_t else f"{'-':>13}"
            print(f"  {impl:<28} {label:>7} {t:12.3f} {diff} {ratio}")
    if failures:
        print(f"FAILED: {len(failures)} problem(s)")
        for f in failures:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
