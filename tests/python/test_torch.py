"""elasticrun.torch under the real launcher: every collective against single-process
references (every dtype and op, 2 and 3 ranks), DistributedOptimizer against one process
training on the whole batch, and TorchState + ElasticSampler through real faults (a
worker SIGKILLed mid-epoch, hosts added and removed by a discovery script), checking
that every sample of every epoch was processed exactly once in the surviving lineage."""
import json
from collections import Counter

import pytest

from conftest import HERE, PYTHON, python_env, run_python

CHECKS = HERE / "workers" / "torch_checks.py"
OPTIMIZER = HERE / "workers" / "torch_optimizer.py"
ELASTIC = HERE / "workers" / "torch_elastic.py"


def ok_lines(r, tag, n):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count(tag) == n, r.stdout[-3000:]


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("mode", ["allreduce", "others", "functions"])
def test_collectives_match_references(job, mode, np):
    r = run_python(job, ["-np", np], CHECKS, mode, timeout=180)
    ok_lines(r, f"torch_checks {mode}: OK", np)


def test_collective_before_init_is_a_clear_error():
    import subprocess
    r = subprocess.run([PYTHON, str(CHECKS), "before_init"], capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, **python_env()})
    assert r.returncode == 0 and "torch_checks before_init: OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("mode,np", [("plain", 2), ("plain", 3), ("bpps", 2), ("fp16", 2), ("clip", 2),
                                     ("sum", 3)])
def test_distributed_optimizer_matches_one_process(job, mode, np):
    r = run_python(job, ["-np", np], OPTIMIZER, mode, timeout=180)
    ok_lines(r, f"torch_optimizer {mode}: OK", np)
