"""elasticrun.torch's DistributedOptimizer against torch DDP on the gloo backend: the
same MLP (about 16M parameters), the same per-rank batch, the same machine, in one run.

    /usr/bin/python3 bench/torch_ddp_bench.py [--np 2,4] [--steps 30] [--batch 16] [--overlap on|off] [--repeats 1]

For each rank count it launches the elasticrun workers under build/cmd/elasticrun, then
the DDP workers as plain subprocesses (env:// rendezvous, MASTER_ADDR/PORT set here),
one after the other. Every worker runs forward + backward + step on random data; the
time of a step is the maximum over ranks (one allreduce per step, outside the timed
part), the reported figure the median over the steps after warm-up. Prints samples/s
of each and the ratio (elasticrun / DDP; above 1 is faster). torch uses one thread per
process (set_num_threads(1)) in both, so the ranks do not fight over cores.

A third run, "compute only", is the DDP script with every step inside DDP's no_sync():
the same processes, model and batch, no gradient communication. Its samples/s over
DDP's is the ceiling: what DistributedOptimizer would reach if exchanging the gradients
cost nothing at all. After its steps, the elasticrun run also times the exchange alone: the
whole gradient (every parameter, flat) allreduced in DistributedOptimizer's 25 MiB
buckets, no computation beside it (median of 10, slowest rank). When every core of the
host is computing (as many ranks as cores), the exchange cannot overlap anything, so
DDP's step over (compute only + exchange alone) bounds the ratio: "bound" below. With --repeats, the three runs are repeated in turn and the median
ratio and ceiling printed.

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
WIDTHS = [1024, 4096, 2048, 1024, 1024]  # 4.2M + 8.4M + 2.1M + 1.0M weights: ~15.7M parameters


def model():
    import torch
    layers = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def worker(kind, steps, warmup, batch, overlap="on"):
    import contextlib
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    if kind == "er":
        import elasticrun.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(),
                                       overlap=overlap == "on")
        step_model = net

        def max_over_ranks(x):
            return float(hvd.allreduce(torch.tensor([x], dtype=torch.float64), op=hvd.Max))

        def params_agree():
            flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
            return bool(torch.equal(hvd.broadcast(flat, 0), flat))
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
        rank, size = dist.get_rank(), dist.get_world_size()
        step_model = torch.nn.parallel.DistributedDataParallel(net)

        def max_over_ranks(x):
            t = torch.tensor([x], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t)

        def params_agree():
            flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
            other = flat.clone()
            dist.broadcast(other, 0)
            return bool(torch.equal(other, flat))
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, WIDTHS[0], generator=g)
    y = torch.randn(batch, WIDTHS[-1], generator=g)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with step_model.no_sync() if kind == "none" else contextlib.nullcontext():
            torch.nn.functional.mse_loss(step_model(x), y).backward()
        opt.step()
        t = max_over_ranks(time.perf_counter() - t0)
        if step >= warmup:
            times.append(t)
    # Without communication the ranks' parameters drift apart: no check there.
    agree = params_agree() or kind == "none"
    exchange_s = None
    if kind == "er":
        flat = torch.ones(sum(p.numel() for p in net.parameters()))
        chunks = torch.split(flat, 25 * 2**20 // flat.element_size())
        runs = []
        for _ in range(12):
            t0 = time.perf_counter()
            for h in [hvd.allreduce_async_(c, op=hvd.Average) for c in chunks]:
                hvd.synchronize(h)
            runs.append(max_over_ranks(time.perf_counter() - t0))
        exchange_s = statistics.median(runs[2:])
    if rank == 0:
        print("RESULT " + json.dumps({"kind": kind, "size": size, "median_s": statistics.median(times),
                                      "agree": agree, "exchange_s": exchange_s}), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def result_of(out):
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    return None


def run_er(n, args):
    env = dict(os.environ, PYTHONPATH=str(BUILD / "python"))
    cmd = [str(BUILD / "cmd" / "elasticrun"), "-np", str(n), "-x", "PYTHONPATH", PYTHON, __file__, "--worker", "er",
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
           "--overlap", args.overlap]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    return result_of(p.stdout), p


def run_ddp(n, args, kind="ddp"):
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n))
        procs.append(subprocess.Popen([PYTHON, __file__, "--worker", kind, "--steps", str(args.steps), "--warmup",
                                       str(args.warmup), "--batch", str(args.batch)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=900) for p in procs]
    failed = next((p for p in procs if p.returncode != 0), None)
    result = result_of(outs[0][0])

    class Done:
        returncode = failed.returncode if failed else 0
        stdout = "".join(o for o, _ in outs)
        stderr = "".join(e for _, e in outs)

    return result, Done


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    ap.add_argument("--overlap", choices=["on", "off"], default="on",
                    help="DistributedOptimizer's overlap= (on: buckets reduced during backward())")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each per rank count, interleaved")
    ap.add_argument("--worker", choices=["er", "ddp", "none"])
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.warmup, args.batch, args.overlap)
        return
    params = sum(a * b + b for a, b in zip(WIDTHS, WIDTHS[1:]))
    print(f"MLP {'-'.join(map(str, WIDTHS))}: {params / 1e6:.1f}M parameters, batch {args.batch} per rank, "
          f"{args.steps} timed steps after {args.warmup}, median of the slowest rank's step, overlap {args.overlap}")
    print(f"{'ranks':>5} {'elasticrun samples/s':>21} {'DDP gloo samples/s':>19} {'ratio':>6} "
          f"{'compute only samples/s':>23} {'ceiling':>8} {'exchange alone ms':>18} {'bound':>6}")
    bad = []
    for n in [int(v) for v in args.np.split(",")]:
        ratios, ceilings, bounds = [], [], []
        for _ in range(args.repeats):
            er, p1 = run_er(n, args)
            ddp, p2 = run_ddp(n, args)
            none, p3 = run_ddp(n, args, "none")
            for name, res, p in (("elasticrun", er, p1), ("ddp", ddp, p2), ("compute only", none, p3)):
                if p.returncode != 0 or res is None or not res["agree"]:
                    bad.append(f"{name} at {n} ranks: rc {p.returncode}, result {res}: {p.stderr[-1500:]}")
            if er and ddp and none:
                a, b, c = (args.batch * n / r["median_s"] for r in (er, ddp, none))
                ratios.append(a / b)
                ceilings.append(c / b)
                bounds.append(ddp["median_s"] / (none["median_s"] + er["exchange_s"]))
                print(f"{n:>5} {a:>21.1f} {b:>19.1f} {a / b:>6.2f} {c:>23.1f} {c / b:>8.2f} "
                      f"{er['exchange_s'] * 1e3:>18.1f} {bounds[-1]:>6.2f}", flush=True)
        if len(ratios) > 1:
            print(f"{n:>5} median ratio of {len(ratios)}: {statistics.median(ratios):.2f}, "
                  f"median ceiling {statistics.median(ceilings):.2f}, median bound {statistics.median(bounds):.2f}",
                  flush=True)
    for b in bad:
        print("FAILED:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
