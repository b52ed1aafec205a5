#!/usr/bin/python3
"""A plain torchrun DDP script: nothing in it knows elasticrun. It runs the same under

    torchrun --nproc-per-node 2 examples/python/ddp_torchrun.py --checkpoint /tmp/ck.pt
    elasticrun -np 3 -H localhost:2,127.0.0.2:1 --max-restarts 3 \\
        /usr/bin/python3 examples/python/ddp_torchrun.py --checkpoint /tmp/ck.pt

init_process_group("gloo") from env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), a
small MLP in DistributedDataParallel, plain SGD on synthetic regression data that depends
only on the step and the rank, so that the result is the same whenever the job is
interrupted. Rank 0 saves a checkpoint (step, model, optimizer) every --checkpoint-every
steps, atomically; every rank resumes from it at start: a restarted generation (torchrun's
or elasticrun's restart mode) goes on where the checkpoint left off.

It prints, for tests and benchmarks:
  ddp: rank R local_rank L world W pg_rank R pg_world W group G/GW restart C port M pid P
  ddp: resumed at step S                      (when it found a checkpoint)
  ddp: step S rank R restart C t=<wall seconds>   (every step with --print-steps; always the first)
  ddp: done steps N params <sum> <sum of squares> max_diff D   (rank 0: D = largest
       difference between any rank's parameters and its own, from an allgather)

--raise-at-step S raises an exception on rank --fail-rank in the first generation
(TORCHELASTIC_RESTART_COUNT 0, or every generation with --fail-always); main() is wrapped in
torch's @record, so the exception and its traceback go to TORCHELASTIC_ERROR_FILE.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint", required=True, help="file rank 0 saves to and every rank resumes from")
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--step-ms", type=float, default=0, help="sleep per step, to leave time for a fault")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--print-steps", action="store_true")
    p.add_argument("--raise-at-step", type=int, default=-1)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-always", action="store_true")
    return p.parse_args()


def batch(step, rank, dim):
    """The rank's data at a step: the same in every generation."""
    g = torch.Generator().manual_seed(1000003 * step + rank)
    x = torch.randn(32, dim, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.5 + 1.0
    return x, y


def load(path, model, opt):
    if not os.path.exists(path):
        return 0
    ck = torch.load(path)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    return ck["step"]


def save(path, step, model, opt):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, path)


@record
def main():
    a = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = os.environ
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"ddp: rank {env['RANK']} local_rank {env['LOCAL_RANK']} world {env['WORLD_SIZE']} pg_rank {rank} "
          f"pg_world {world} group {env.get('GROUP_RANK')}/{env.get('GROUP_WORLD_SIZE')} restart {restart} "
          f"port {env['MASTER_PORT']} pid {os.getpid()}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(a.dim, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = load(a.checkpoint, model, opt)
    if start:
        print(f"ddp: resumed at step {start}", flush=True)
    ddp = DDP(model)
    for step in range(start + 1, a.steps + 1):
        if step == a.raise_at_step and rank == a.fail_rank and (restart == 0 or a.fail_always):
            raise RuntimeError(f"injected failure at step {step} on rank {rank}")
        x, y = batch(step, rank, a.dim)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if a.print_steps or step == start + 1:
            print(f"ddp: step {step} rank {rank} restart {restart} t={time.time():.6f}", flush=True)
        if rank == 0 and step % a.checkpoint_every == 0:
            save(a.checkpoint, step, model, opt)
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    if rank == 0:
        diff = max(float((t - flat).abs().max()) for t in every)
        print(f"ddp: done steps {a.steps} params {float(flat.double().sum()):.10f} "
              f"{float((flat.double() ** 2).sum()):.10f} max_diff {diff}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
