"""The holder rule (cmd/controller.h): a worker holds the job's committed state once its
library reported a completed sync, not when it joined. Rank 0 of every epoch is such a
holder; when none is left the job ends (or, with --checkpoint-dir, goes on from the newest
checkpoint) instead of carrying on from a newcomer's initial state.

Each test grows a one-worker job with a discovery script, then kills the only old holder
at a chosen moment of the grown epoch: before its newcomers received the state (they
hold nothing), or just after (they hold it, and one of them must carry it on)."""
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import discovery_script as discovery
from invariant import check_commits
from test_elastic import first, wait_for_event
from test_sgd import SGD, check, host_of, reference, sgd_workers

NO_HOLDER = "no surviving worker holds committed state"


def wait_for_progress(path, step, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if int(Path(path).read_text()) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"rank 0 did not commit step {step} within {timeout} s")


def kill_host_worker(job, host, n):
    """SIGKILLs the elastic_sgd worker on `host`, one of the job's `n`."""
    pid = next(p for p in sgd_workers(job, n) if host_of(p) == host)
    os.kill(pid, signal.SIGKILL)


def grown_job(job, tmp_path, args, newcomers):
    """Starts elastic_sgd `args` on localhost alone, waits for rank 0's commit of step 10,
    then lists `newcomers` (a host:slots line) too. Returns (Popen, events path)."""
    hosts, script = discovery(tmp_path, ["localhost:1"])
    ev, progress = tmp_path / "events", tmp_path / "progress"
    p = job.start(["--min-np", 1, "--max-np", 3, "--host-discovery-script", script, "--discovery-interval", 0.2,
                   "--events", ev, SGD, *map(str, args), "--progress-file", progress])
    wait_for_progress(progress, 10)
    hosts.write_text("localhost:1\n" + newcomers + "\n")
    return p, ev


def test_rank0_lost_before_the_newcomers_synced_leaves_no_holder(job, tmp_path):
    """The old worker waits 4 s in its reset callback, after the grown epoch formed and
    before its sync: the newcomers have joined and wait for its state. Killed there, it
    leaves two workers that hold only their initial model, and the job must end rather
    than let one of them broadcast that as the state (the commits would start again)."""
    args = ["--steps", 400, "--dim", 64, "--batch", 48, "--commit-every", 5, "--step-ms", 10, "--reset-ms", 4000]
    p, ev = grown_job(job, tmp_path, args, "127.0.0.2:2")
    wait_for_event(job, ev, "epoch_joined", epoch=2)
    kill_host_worker(job, "localhost", 3)
    out, err = p.communicate(timeout=60)
    events = job.events(ev)
    assert not first(events, "state_synced", epoch=2), events  # the kill came before the sync
    assert p.returncode == 1, (p.returncode, out[-2000:], err[-3000:])
    assert NO_HOLDER in err, err[-3000:]
    seq = check_commits_so_far(out)
    assert all(e == 1 for _, _, e in seq), seq  # nobody trained after the loss


def check_commits_so_far(out):
    """Rank 0's commits never went back (check_commits without the end it must reach)."""
    seq = [tuple(map(int, m)) for m in re.findall(r"committed step (\d+) size (\d+) epoch (\d+)", out)]
    assert seq, out[-2000:]
    return check_commits(out, seq[-1][0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rank0_killed_at_a_random_moment_of_a_grown_epochs_sync(job, tmp_path, seed):
    """As above, at a random moment from the epoch's forming to shortly after its sync
    (the reset callback waits 0.3 s; the sync of a 256 KiB model follows). Either the
    newcomers had received the state (one goes on as rank 0 and the job ends with the
    reference model) or not (the job ends naming the loss); the commits never go back."""
    rng = random.Random(seed)
    args = ["--steps", 80, "--dim", 32768, "--batch", 4, "--commit-every", 5, "--step-ms", 10, "--reset-ms", 300]
    p, ev = grown_job(job, tmp_path, args, "127.0.0.2:2")
    wait_for_event(job, ev, "epoch_joined", epoch=2)
    time.sleep(rng.uniform(0.0, 0.45))
    kill_host_worker(job, "localhost", 3)
    out, err = p.communicate(timeout=90)
    synced = [e for e in job.events(ev) if e["event"] == "state_synced" and e["epoch"] == 2]
    if p.returncode == 0:
        check(out, err, p.returncode, 2, reference(args), min_epoch=3)
        assert synced, "the job went on although no newcomer reported its sync"
    else:
        assert p.returncode == 1 and NO_HOLDER in err, (p.returncode, err[-3000:])
        assert not any(e["host"] == "127.0.0.2" for e in synced), synced
        check_commits_so_far(out)


def test_a_newcomer_that_synced_carries_the_state_on(job, tmp_path):
    """The newcomer reported its sync; the old worker is killed at once, before the grown
    epoch's first commit. The newcomer, rank 0 of the next epoch, must go on from the
    state it received (a library whose sync left its restore point at the initial model
    started the commits again from 0), and it must count as a holder (a driver that did
    not hear its sync ended the job)."""
    args = ["--steps", 50, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 200]
    p, ev = grown_job(job, tmp_path, args, "127.0.0.2:1")
    wait_for_event(job, ev, "state_synced", epoch=2, host="127.0.0.2")
    kill_host_worker(job, "localhost", 2)
    out, err = p.communicate(timeout=90)
    seq = check(out, err, p.returncode, 1, reference(args), min_epoch=3)
    assert not any(e == 2 for _, _, e in seq), seq  # killed before epoch 2's first commit
    synced = first(job.events(ev), "state_synced", epoch=2, host="127.0.0.2")
    assert synced["commits"] >= 1, synced  # it received the old worker's commits
