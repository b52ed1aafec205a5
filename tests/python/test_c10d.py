"""The torch.distributed backend 'elasticrun' (python/src/c10d/) under the real launcher:
every op against Gloo's results on the same inputs in the same workers (dtypes, ops,
roots, list and _base forms, uneven all_to_all, mixed with elasticrun.torch's own
collectives), the refusals (non-contiguous, element types, devices, layouts, ops,
subgroups, ranks that are not elasticrun's), DistributedDataParallel over it against DDP
over Gloo (several buckets, unused parameters, the fp16 and PowerSGD communication
hooks, a hook whose callback waits for a collective of its own), and a worker SIGKILLed
inside a DDP allreduce, whose peers' backward() must raise within the library's bound.
torch's env:// store (the Gloo group's) is where elasticrun's MASTER_ADDR and MASTER_PORT
say, the port the daemon reserved: a port picked here and let go could be taken first."""
import os
import re
import subprocess

import pytest

from conftest import BUILD, HERE, PYTHON, python_env, run_python

CHECKS = HERE / "workers" / "c10d_checks.py"
DDP = HERE / "workers" / "c10d_ddp.py"

pytestmark = pytest.mark.skipif(not list((BUILD / "python" / "elasticrun").glob("_c10d*.so")),
                                reason="the elasticrun backend was not built (no libtorch-dev at meson setup)")


def check_ok(r, tag, n, minimum):
    """Exit 0, and `tag: OK <k> checks` from each of the n ranks with k >= minimum (a
    worker that stopped checking fails)."""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    counts = [int(c) for c in re.findall(rf"{tag}: OK (\d+) checks", r.stdout)]
    assert len(counts) == n and min(counts) >= minimum, (counts, r.stdout[-3000:])


@pytest.mark.parametrize("np", [2, 3])
def test_ops_match_gloo(job, np):
    r = run_python(job, ["-np", np], CHECKS, "ops", timeout=240)
    check_ok(r, "c10d_checks ops", np, 520)


def test_refusals_are_clear_errors(job):
    r = run_python(job, ["-np", 2], CHECKS, "errors", timeout=120)
    check_ok(r, "c10d_checks errors", 2, 17)


@pytest.mark.parametrize("mode,np", [("plain", 2), ("plain", 3), ("unused", 2), ("fp16hook", 2), ("powersgd", 3),
                                     ("waiting", 2)])
def test_ddp_matches_gloo(job, mode, np):
    r = run_python(job, ["-np", np], DDP, mode, timeout=120)
    check_ok(r, f"c10d_ddp {mode}", np, 100)


def test_worker_killed_inside_ddp_allreduce(job, tmp_path):
    """The rank on 127.0.0.3 SIGKILLs itself in its DDP communication hook at step 3: the
    two others' backward() raises within the library's bound (the driver's abort: well
    under a second; 5 s allowed on a loaded machine), naming the process group's op, and
    the process group's next op raises WorkersFailedError at once. Then the survivors
    re-join (epoch 2, two ranks): the old group refuses work, naming the epochs, and a new
    group (destroy_process_group, init_process_group over a FileStore) works."""
    r = run_python(job, ["-H", "localhost:1,127.0.0.2:1,127.0.0.3:1", "--min-np", 1], DDP, "kill",
                   tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    raised = re.findall(r"rank (\d) raised RuntimeError at step 3, ([\d.]+) s after the kill: elasticrun process "
                        r"group: allreduce: ", r.stdout)
    assert sorted(rank for rank, _ in raised) == ["0", "1"], r.stdout[-3000:]
    assert max(float(s) for _, s in raised) < 5.0, raised
    assert r.stdout.count("then all_reduce raised WorkersFailedError") == 2, r.stdout[-3000:]
    # after the survivors re-joined: the old group refuses work, a new one works
    assert r.stdout.count("the old group refused: elasticrun process group: allreduce: this process group was "
                          "made in epoch 1 and the job is in epoch 2 now") == 2, r.stdout[-3000:]
    assert r.stdout.count("a new group in epoch 2: ") == 2 and r.stdout.count("of 2, all_reduce 2.0") == 2, \
        r.stdout[-3000:]


def test_init_process_group_outside_the_launcher_says_so():
    code = ("import torch.distributed as dist, elasticrun.torch\n"
            "dist.init_process_group('elasticrun', store=dist.HashStore(), rank=0, world_size=1)\n")
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **python_env()})
    assert r.returncode != 0 and "run this program under elasticrun" in r.stderr, r.stderr[-2000:]
