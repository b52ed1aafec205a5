"""torch DistributedDataParallel over the backend 'elasticrun' against DDP over 'gloo':
the same script (only the backend's name differs), the same communication-heavy MLP
(about 16M parameters, as bench/torch_ddp_bench.py), the same per-rank batch, the same
machine, in one run.

    /usr/bin/python3 bench/ddp_backend_bench.py [--np 2,4] [--steps 30] [--warmup 5] [--batch 2] [--repeats 1]

For each rank count and repeat it runs the elasticrun backend's workers under
build/cmd/elasticrun, then Gloo's as plain subprocesses (env:// rendezvous, MASTER_ADDR
and MASTER_PORT set here, as torchrun would), one after the other. Every worker runs
forward + backward + step on random data; the time of a step is the maximum over ranks
(one all_reduce per step, outside the timed part), a run's figure the median over the
steps after warm-up. Prints samples/s of each, and the ratio (elasticrun / gloo; above 1
is faster); with --repeats, every repeat's figures and the median ratio. torch uses one
thread per process (set_num_threads(1)) in both, so that the ranks do not fight over
cores.

A third run per repeat, "compute only", is Gloo's script with every step inside DDP's
no_sync(): the same processes, model and batch, no gradient communication at all. Its
samples/s over Gloo's is the ceiling: what any backend would reach if its collectives
cost nothing. A ratio target above the ceiling cannot be met on the machine measured;
the ceiling says how much of Gloo's step is communication.

Exit status 1 when a run fails or the ranks' parameters differ at the end.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("ELASTICRUN_BUILD", ROOT / "build"))
PYTHON = "/usr/bin/python3"
WIDTHS = [1024, 4096, 2048, 1024, 1024]  # ~15.7M parameters, as torch_ddp_bench.py


def model(widths):
    import torch
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def worker(backend, args):
    import contextlib
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    compute_only = backend == "none"
    if compute_only:
        backend = "gloo"
    if backend == "elasticrun":
        import elasticrun
        import elasticrun.torch  # noqa: F401 - registers the backend
        elasticrun.init()
        os.environ.setdefault("RANK", str(elasticrun.rank()))
        os.environ.setdefault("WORLD_SIZE", str(elasticrun.size()))
    dist.init_process_group(backend, init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()
    widths = [int(w) for w in args.widths.split(",")]
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(model(widths))
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, widths[0], generator=g)
    y = torch.randn(args.batch, widths[-1], generator=g)
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with net.no_sync() if compute_only else contextlib.nullcontext():
            torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(float(t))
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    root = flat.clone()
    dist.broadcast(root, 0)
    if rank == 0:
        print("RESULT " + json.dumps({"backend": "none" if compute_only else backend, "size": size, "median_s": statistics.median(times),
                                      "agree": bool(torch.equal(root, flat))}), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def result_of(out):
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    return None


def worker_args(backend, args):
    return [PYTHON, __file__, "--worker", backend, "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch",
            str(args.batch), "--widths", args.widths]


def run_elasticrun(n, args):
    env = dict(os.environ, PYTHONPATH=str(BUILD / "python"))
    cmd = [str(BUILD / "cmd" / "elasticrun"), "-np", str(n), "-x", "PYTHONPATH", "-x", "MASTER_ADDR=127.0.0.1",
           "-x", f"MASTER_PORT={free_port()}", *worker_args("elasticrun", args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    return result_of(p.stdout), p.returncode, p.stderr


def run_plain(n, args, backend):
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n))
        procs.append(subprocess.Popen(worker_args(backend, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = [p.communicate(timeout=900) for p in procs]
    code = next((p.returncode for p in procs if p.returncode != 0), 0)
    return result_of(outs[0][0]), code, "".join(e for _, e in outs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2, help="samples per rank and step")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each backend per rank count, interleaved")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="the MLP's layer widths")
    ap.add_argument("--worker", choices=["elasticrun", "gloo", "none"])
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    widths = [int(w) for w in args.widths.split(",")]
    params = sum(a * b + b for a, b in zip(widths, widths[1:]))
    print(f"DDP, MLP {'-'.join(map(str, widths))}: {params / 1e6:.2f}M parameters, batch {args.batch} per rank, "
          f"{args.steps} timed steps after {args.warmup}, median of the slowest rank's step")
    print(f"{'ranks':>5} {'elasticrun samples/s':>21} {'gloo samples/s':>15} {'ratio':>6} "
          f"{'compute only samples/s':>23} {'ceiling':>8}")
    bad = []
    for n in [int(v) for v in args.np.split(",")]:
        ratios, ceilings = [], []
        for _ in range(args.repeats):
            got = {}
            for backend in ("elasticrun", "gloo", "none"):
                res, code, err = run_elasticrun(n, args) if backend == "elasticrun" else run_plain(n, args, backend)
                # Without communication the ranks' parameters drift apart: no check there.
                if code != 0 or res is None or not (res["agree"] or backend == "none"):
                    bad.append(f"{backend} at {n} ranks: exit status {code}, result {res}: {err[-1500:]}")
                else:
                    got[backend] = args.batch * n / res["median_s"]
            if len(got) == 3:
                ratios.append(got["elasticrun"] / got["gloo"])
                ceilings.append(got["none"] / got["gloo"])
                print(f"{n:>5} {got['elasticrun']:>21.1f} {got['gloo']:>15.1f} {ratios[-1]:>6.2f} "
                      f"{got['none']:>23.1f} {ceilings[-1]:>8.2f}", flush=True)
        if len(ratios) > 1:
            print(f"{n:>5} median ratio of {len(ratios)}: {statistics.median(ratios):.2f}, "
                  f"median ceiling {statistics.median(ceilings):.2f}", flush=True)
    for b in bad:
        print("FAILED:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
