"""The elastic invariant: after any sequence of failures and resizes, elastic_sgd's final
model equals the one a single uninterrupted process computes (bit-exact: the gradients
are fixed-point integers), and the commit log in that model shows every commit step
exactly once. Failures are real signals to real processes at chosen or random moments."""
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES
from conftest import our_processes
from invariant import check_commits  # noqa: F401 - re-exported for the other suites
from test_elastic import discovery, epochs, recovery_seconds, wait_for_event

SGD = EXAMPLES / "elastic_sgd"
ARGS = ["--steps", 120, "--dim", 64, "--batch", 48, "--commit-every", 5]


def reference(args=ARGS):
    r = subprocess.run([str(SGD), *map(str, args), "--reference"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def finals(out):
    return [l.split(": ", 1)[1] for l in out.splitlines() if "]<stdout>: final " in l]


def sgd_workers(job, n, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = []
        for p in our_processes(job.tag):
            try:
                if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/elastic_sgd"):
                    pids.append(p)
            except OSError:
                pass
        if len(pids) >= n:
            return sorted(pids)
        time.sleep(0.05)
    raise AssertionError(f"{n} elastic_sgd workers did not start")


def host_of(pid):
    env = Path(f"/proc/{pid}/environ").read_bytes()
    return env.split(b"ELASTICRUN_HOST=")[1].split(b"\0")[0].decode()


def check(r_out, r_err, code, n_final, want, min_epoch=1):
    """The job succeeded, each of `n_final` workers printed the reference line `want`, and
    rank 0's commits never went back and reached the end in epoch `min_epoch` or later
    (check_commits)."""
    assert code == 0, r_err[-4000:]
    got = finals(r_out)
    assert len(got) == n_final, r_out[-3000:]
    assert all(g == want for g in got), (got, want)
    return check_commits(r_out, int(re.search(r"\bstep=(\d+)", want).group(1)), min_epoch)


HOSTS = "localhost:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"


def test_uninterrupted_run_matches_reference(job):
    r = job.run(["-np", 3, SGD, *ARGS])
    check(r.stdout, r.stderr, r.returncode, 3, reference())


@pytest.mark.parametrize("fail_rank,step", [(2, 37), (0, 41), (1, 46)])
def test_injected_failure_keeps_the_invariant(job, tmp_path, fail_rank, step):
    """Each failure is between commits (every 5 steps), where the survivors have changed
    tracked state since the last one (elastic_sgd's `begun` counts a step before its
    allreduce), so only State::restore() makes their result right. Rank 1 at step 46 dies
    one step after the commit of step 45."""
    ev = tmp_path / "events"
    r = job.run(["-np", 4, "--min-np", 2, "-H", HOSTS, "--events", ev, SGD, *ARGS, "--step-ms", 5,
                 "--fail-at-step", step, "--fail-rank", fail_rank, "--fail-signal", 9])
    assert f"elastic_sgd: injected failure at step {step} on rank {fail_rank}" in r.stderr, r.stderr[-3000:]
    check(r.stdout, r.stderr, r.returncode, 3, reference(), min_epoch=2)
    events = job.events(ev)
    assert [e["size"] for e in epochs(events)] == [4, 3]
    assert recovery_seconds(events, 2) < 2.0


def test_a_commit_whose_closing_allreduce_failed_is_reported(job):
    """Rank 1 dies once step 20 (the last) is done, before its commit: rank 0's commit()
    takes the snapshot of 20 and then fails in its host-update allreduce. That commit
    stands (the next epoch syncs from it and has nothing left to train), so rank 0 must
    report it: the commit log then reaches step 20. A CI run once ended with the log at
    the commit before, and the schedule's check called the progress lost."""
    args = ["--steps", 20, "--dim", 32, "--batch", 16, "--commit-every", 10]
    r = job.run(["-np", 2, "--min-np", 1, "-H", "localhost:1,127.0.0.2:1", SGD, *args,
                 "--fail-at-step", 20, "--fail-rank", 1, "--fail-in-commit", "--fail-signal", 9])
    assert "elastic_sgd: injected failure at step 20 on rank 1" in r.stderr, r.stderr[-3000:]
    seq = check(r.stdout, r.stderr, r.returncode, 1, reference(args))
    assert seq[-1][2] == 1, seq  # the report of the interrupted commit, from epoch 1


def test_a_commit_whose_closing_allreduce_failed_reaches_the_driver(job, tmp_path):
    """The same failed commit with --report: report() is collective, so rank 0 could not
    tell the driver of step 20 in epoch 1; the next epoch, having synced that commit,
    reports it. The driver's events then reach step 20 (they stopped at 10), and report
    each step once."""
    args = ["--steps", 20, "--dim", 32, "--batch", 16, "--commit-every", 10]
    ev = tmp_path / "events"
    r = job.run(["-np", 2, "--min-np", 1, "-H", "localhost:1,127.0.0.2:1", "--events", ev, SGD, *args, "--report",
                 "--fail-at-step", 20, "--fail-rank", 1, "--fail-in-commit", "--fail-signal", 9])
    assert "elastic_sgd: injected failure at step 20 on rank 1" in r.stderr, r.stderr[-3000:]
    check(r.stdout, r.stderr, r.returncode, 1, reference(args))
    reports = [(e["step"], e["epoch"]) for e in job.events(ev) if e["event"] == "report"]
    assert reports == [(10, 1), (20, 2)], reports


def test_random_sigkills_keep_the_invariant(job, tmp_path):
    """Three workers killed at random moments: in allreduces, commits, syncs or while the
    survivors re-join (the second and third kills often land during recovery)."""
    rng = random.Random(int(os.environ.get("ER_TEST_SEED", "7")))
    ev = tmp_path / "events"
    hosts = "localhost:1," + ",".join(f"127.0.0.{i}:1" for i in range(2, 7))
    p = job.start(["-np", 6, "--min-np", 2, "-H", hosts, "--events", ev, SGD, "--steps", 300, "--dim", 64,
                   "--batch", 48, "--commit-every", 5, "--step-ms", 8])
    pids = sgd_workers(job, 6)
    victims = rng.sample([pid for pid in pids if host_of(pid) != "localhost"], 3)
    for v in victims:
        time.sleep(rng.uniform(0.05, 0.6))
        try:
            os.kill(v, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 3, reference(["--steps", 300, "--dim", 64, "--batch", 48, "--commit-every", 5]),
          min_epoch=2)


def test_kill_rank0_right_after_a_reset(job, tmp_path):
    """The second failure hits while state is being synced after the first."""
    ev = tmp_path / "events"
    p = job.start(["-np", 4, "--min-np", 1, "-H", HOSTS, "--events", ev, SGD, *ARGS, "--step-ms", 10])
    pids = sgd_workers(job, 4)
    by_host = {host_of(pid): pid for pid in pids}
    time.sleep(0.3)
    os.kill(by_host["127.0.0.4"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not epochs(job.events(ev))[1:] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert epochs(job.events(ev))[1:], "the first kill brought no reset within 10 s: " + str(job.events(ev))
    os.kill(by_host["localhost"], signal.SIGKILL)  # rank 0 of epoch 2
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 2, reference(), min_epoch=3)


def test_sigstopped_worker_keeps_the_invariant(job, tmp_path):
    ev = tmp_path / "events"
    p = job.start(["-np", 4, "--min-np", 2, "-H", HOSTS, "--rendezvous-timeout", 1, "--events", ev, SGD, *ARGS,
                   "--step-ms", 10])
    by_host = {host_of(pid): pid for pid in sgd_workers(job, 4)}
    time.sleep(0.3)
    os.kill(by_host["127.0.0.3"], signal.SIGSTOP)
    os.kill(by_host["127.0.0.4"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 2, reference(), min_epoch=2)


def test_hosts_added_and_removed_keep_the_invariant(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1"])
    ev = tmp_path / "events"
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.1, "--events", ev,
                   SGD, *ARGS, "--step-ms", 15])
    sgd_workers(job, 2)
    time.sleep(0.3)
    hosts.write_text("localhost:1\n127.0.0.2:1\n127.0.0.3:2\n")  # grow to 4
    # Shrinks once all 4 have joined (a fixed wait can end before the growth on a busy machine)
    wait_for_event(job, ev, "epoch_joined", timeout=60, size=4)
    hosts.write_text("localhost:1\n127.0.0.3:2\n")  # shrink to 3
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 3, reference(), min_epoch=3)
    sizes = [e["size"] for e in epochs(job.events(ev))]
    assert sizes[0] == 2 and 4 in sizes and sizes[-1] == 3, sizes


def run_with_silent_worker(job, tmp_path, rendezvous_timeout, collective_timeout, min_epoch):
    """3 workers on 3 hosts; the one on 127.0.0.2 is SIGSTOPped and nothing else happens.
    Checks the survivors' model and that only 127.0.0.2 was blacklisted; returns the
    events and the driver's stderr. The worker timeout is off: these are the paths that
    find a silent worker without it (tests/integration/test_worker_timeout.py has it on)."""
    ev = tmp_path / "events"
    p = job.start(["-np", 3, "--min-np", 2, "-H", "localhost:1,127.0.0.2:1,127.0.0.3:1", "--worker-timeout", 0,
                   "--rendezvous-timeout", rendezvous_timeout, "--events", ev, SGD, *ARGS, "--step-ms", 10],
                  env={"ELASTICRUN_COLLECTIVE_TIMEOUT": str(collective_timeout)})
    by_host = {host_of(pid): pid for pid in sgd_workers(job, 3)}
    time.sleep(0.5)
    os.kill(by_host["127.0.0.2"], signal.SIGSTOP)
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 2, reference(), min_epoch)
    events = job.events(ev)
    blacklisted = [e["host"] for e in events if e["event"] == "host_blacklisted"]
    assert blacklisted == ["127.0.0.2"], events
    return events, err


def test_silent_worker_alone_does_not_blacklist_the_healthy(job, tmp_path):
    """A worker goes silent (SIGSTOP) and nothing else happens: no exit, no lost
    connection, so only the collective timeout notices. The ranks that time out re-join
    instead of exiting; the driver, seeing the epoch abandoned, starts the next one, in
    which the silent worker fails to join and is the only one blacklisted."""
    events, err = run_with_silent_worker(job, tmp_path, rendezvous_timeout=2, collective_timeout=2, min_epoch=3)
    assert "gave up on epoch 1" in err, err
    assert [e["size"] for e in epochs(events)] == [3, 3, 2], events


def test_silent_worker_is_failed_when_collectives_time_out_sooner(job, tmp_path):
    """The collective timeout (1.5 s) is much shorter than --rendezvous-timeout (6 s): the
    healthy ranks give up on each new epoch long before the silent worker's join deadline.
    That deadline must run from the first epoch it missed, not restart with every
    abandoned epoch (which kept it in, and the job cycling epochs, for ever)."""
    events, _ = run_with_silent_worker(job, tmp_path, rendezvous_timeout=6, collective_timeout=1.5, min_epoch=2)
    sizes = [e["size"] for e in epochs(events)]
    assert sizes[-1] == 2 and len(sizes) <= 6, sizes  # a few abandoned epochs at most


@pytest.mark.parametrize("args,message", [
    (["--fail-in-commit", "--fail-at-step", 7, "--fail-rank", 1], "needs a --fail-at-step that is a commit step"),
    (["--steps", "x"], "--steps needs an integer >= 0, got 'x'"),
    (["--dim", 0], "--dim needs an integer >= 1"),
    (["--bogus", 1], "unknown flag: --bogus"),
])
def test_elastic_sgd_refuses_bad_flags(args, message):
    r = subprocess.run([str(SGD), *map(str, args)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr, r.stderr
