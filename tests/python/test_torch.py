"""elasticrun.torch under the real launcher: every collective against single-process
references (every dtype and op, 2 and 3 ranks), DistributedOptimizer against one process
training on the whole batch, and TorchState + ElasticSampler through real faults (a
worker SIGKILLed mid-epoch, hosts added and removed by a discovery script), checking
that every sample of every epoch was processed exactly once in the surviving lineage."""
import json
import os
import re
import subprocess
from collections import Counter

import pytest

from conftest import HERE, PYTHON, python_env, run_python

CHECKS = HERE / "workers" / "torch_checks.py"
OPTIMIZER = HERE / "workers" / "torch_optimizer.py"
ELASTIC = HERE / "workers" / "torch_elastic.py"


def check_ok_lines(r, tag, n):
    """Exit 0 and `tag` printed by each of the `n` ranks."""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count(tag) == n, r.stdout[-3000:]


# At least this many checks per rank (2 ranks' counts), so that a mode that stopped
# checking fails.
MIN_CHECKS = {"allreduce": 700, "others": 180, "functions": 6, "state": 11, "syncbn": 22}


def run_checks(job, worker, tag, mode, np, least, options=()):
    """`worker mode` at `np` ranks (with elasticrun `options`): exit 0, each rank's
    `<tag> <mode>: OK <n> checks` with n >= least (a mode that stopped checking fails)."""
    r = run_python(job, ["-np", np, *options], worker, mode, timeout=180)
    check_ok_lines(r, f"{tag} {mode}: OK", np)
    counts = [int(c) for c in re.findall(rf"{tag} {mode}: OK (\d+) checks", r.stdout)]
    assert len(counts) == np and min(counts) >= least, counts


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("mode", list(MIN_CHECKS))
def test_collectives_match_references(job, mode, np):
    run_checks(job, CHECKS, "torch_checks", mode, np, MIN_CHECKS[mode])


HOROVOD = HERE / "workers" / "horovod_checks.py"
HOROVOD_MIN = {"gradients": 14, "types": 16, "api": 22, "process_sets": 34, "join": 12, "names": 19}


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("mode", list(HOROVOD_MIN))
def test_horovod_semantics(job, mode, np):
    """Horovod's gradients, types, scale factors, async and grouped forms, build queries.
    names: with a name hold of 200 ms (HOROVOD_CYCLE_TIME), which its checks rely on."""
    options = ["-x", "HOROVOD_CYCLE_TIME=200"] if mode == "names" else []
    run_checks(job, HOROVOD, "horovod_checks", mode, np, HOROVOD_MIN[mode], options)


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "1e9"])
def test_a_bad_cycle_time_is_a_clear_error(value):
    r = subprocess.run([PYTHON, "-c", "import elasticrun"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **python_env(), "HOROVOD_CYCLE_TIME": value})
    assert r.returncode != 0 and "HOROVOD_CYCLE_TIME=" in r.stderr and "milliseconds" in r.stderr, r.stderr[-2000:]


def test_collective_before_init_is_a_clear_error():
    r = subprocess.run([PYTHON, str(CHECKS), "before_init"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **python_env()})
    assert r.returncode == 0 and "torch_checks before_init: OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("mode,np", [("plain", 2), ("plain", 3), ("bpps", 2), ("fp16", 2), ("clip", 2),
                                     ("sum", 3), ("setnone", 2), ("overlap", 2), ("nooverlap", 2),
                                     ("aux", 2)])
def test_distributed_optimizer_matches_one_process(job, mode, np):
    r = run_python(job, ["-np", np], OPTIMIZER, mode, timeout=180)
    check_ok_lines(r, f"torch_optimizer {mode}: OK", np)


N_SAMPLES, EPOCHS = 90, 3  # as in workers/torch_elastic.py


def test_elastic_sampler_and_state_survive_kill_add_and_remove(job, tmp_path):
    """The worker on 127.0.0.2 SIGKILLs itself in epoch 0 two batches after a commit;
    then 127.0.0.3 is added, removed, and 127.0.0.4 added (sizes 2, 1, 2, 1, 2). The
    lineage record the workers commit with their state must show every sample of every
    epoch processed exactly once (at most size-1 padding repeats at an epoch's end),
    and the parameters must be identical on both final ranks."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.2:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    out, ev = tmp_path / "out", tmp_path / "events"
    out.mkdir()
    r = job.run(["-x", "PYTHONPATH", "--min-np", 1, "--max-np", 3, "--host-discovery-script", script,
                 "--discovery-interval", 0.2, "--events", ev, PYTHON, ELASTIC, hosts, out],
                timeout=240, env=python_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for m in ("killed", "added", "grown", "removed", "shrunk", "readded", "regrown"):
        assert (out / m).exists(), f"the fault plan stopped before '{m}': {r.stdout[-2000:]}"
    events = job.events(ev)
    sizes = [e["size"] for e in events if e["event"] == "epoch_started"]
    assert sizes == [2, 1, 2, 1, 2], events
    killed = [e for e in events if e["event"] == "worker_exited" and e["host"] == "127.0.0.2"]
    assert killed and killed[0]["signal"] == 9, events
    assert r.stdout.count("torch_elastic done") == 2, r.stdout[-2000:]

    visits = json.loads((out / "visits.json").read_text())
    for epoch in range(EPOCHS):
        count = Counter(i for e, batch in visits if e == epoch for i in batch)
        missing = sorted(set(range(N_SAMPLES)) - set(count))
        assert not missing, f"epoch {epoch}: samples never processed: {missing}"
        repeats = sum(count.values()) - N_SAMPLES
        assert repeats <= 1 and max(count.values()) <= 2, \
            f"epoch {epoch}: {repeats} repeated visits: {sorted(i for i, c in count.items() if c > 1)}"

    finals = [json.loads(p.read_text()) for p in sorted(out.glob("params.*.json"))]
    assert len(finals) == 2 and {f["size"] for f in finals} == {2}, finals
    assert finals[0]["params"] == finals[1]["params"], "parameters differ between the final ranks"


def test_process_sets_across_an_elastic_reset(job):
    """workers/process_set_reset.py: a worker of 4 is SIGKILLed; in the new epoch of 3 the
    sets are still registered, the one naming rank 3 is a ValueError on every survivor,
    the other still reduces."""
    r = run_python(job, ["--min-np", 2, "-H", "localhost:2,127.0.0.2:1,127.0.0.3:1"],
                   HERE / "workers" / "process_set_reset.py", timeout=180)
    check_ok_lines(r, "process_set_reset: OK", 3)
