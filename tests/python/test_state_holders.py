"""The holder rule for the Python states (elasticrun.elastic): a worker holds the job's
state once its sync reported, not when it joined (tests/integration/test_holders.py has the
C++ side), and a sync takes rank 0's commit count only once everything arrived."""
import os
import re
import signal
import time

from conftest import HERE, discovery_script, run_python, start_python, workers_of
from test_elastic_state import check

WORKER = HERE / "workers" / "elastic_numpy.py"
CHECKS = HERE / "workers" / "state_checks.py"
NO_HOLDER = "no surviving worker holds committed state"


def wait_for_event(job, path, name, timeout=30, **match):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in job.events(path):
            if e["event"] == name and all(e.get(k) == v for k, v in match.items()):
                return e
        time.sleep(0.02)
    raise AssertionError(f"no {name} {match} within {timeout} s: {job.events(path)}")


def grown_job(job, tmp_path, newcomers, *args):
    """elastic_numpy on localhost alone until it synced and trained a little, then
    `newcomers` (a host:slots line) listed too. Returns (Popen, events path)."""
    hosts, script = discovery_script(tmp_path, ["localhost:1"])
    ev = tmp_path / "events"
    p = start_python(job, ["--min-np", 1, "--max-np", 3, "--host-discovery-script", script, "--discovery-interval",
                           0.2, "--events", ev], WORKER, *args)
    wait_for_event(job, ev, "state_synced", epoch=1)
    time.sleep(1.0)
    hosts.write_text("localhost:1\n" + newcomers + "\n")
    return p, ev


def test_a_partial_sync_keeps_this_ranks_commit_count(job, tmp_path):
    r = run_python(job, ["-np", 2, "--checkpoint-dir", tmp_path / "ck"], CHECKS)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("state_checks: OK 4 checks") == 2, r.stdout[-3000:]


def test_a_newcomer_that_synced_carries_the_state_on(job, tmp_path):
    p, ev = grown_job(job, tmp_path, "127.0.0.2:1", 40, "--step-ms", 250)
    wait_for_event(job, ev, "state_synced", epoch=2, host="127.0.0.2")
    os.kill(workers_of(job, "elastic_numpy.py", 2)["localhost"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 1, 40, min_epoch=3)
    # Killed before the grown epoch's first commit.
    assert not re.search(r"committed step \d+ size \d+ epoch 2$", out, re.M), out[-2000:]


def test_rank0_lost_before_the_newcomers_synced_leaves_no_holder(job, tmp_path):
    p, ev = grown_job(job, tmp_path, "127.0.0.2:2", 400, "--step-ms", 10, "--reset-ms", 4000)
    wait_for_event(job, ev, "epoch_joined", epoch=2)
    os.kill(workers_of(job, "elastic_numpy.py", 2)["localhost"], signal.SIGKILL)  # by host: 2
    out, err = p.communicate(timeout=60)
    assert not [e for e in job.events(ev) if e["event"] == "state_synced" and e["epoch"] == 2]
    assert p.returncode == 1, (p.returncode, out[-2000:], err[-3000:])
    assert NO_HOLDER in err, err[-3000:]
