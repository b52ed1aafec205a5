"""--worker-timeout: each worker's library beats on its rendezvous connection from a thread
of its own, so a worker silent for the timeout (SIGSTOPped) is failed in seconds, its host
blacklisted like any failed host and the stopped process killed, while a worker that is
merely slow (a step longer than the timeout) is not. The job fixture checks that nothing
is left behind, the stopped process included."""
import os
import re
import signal
import time

from conftest import TESTPROG, gone_within
from test_elastic import epochs, first, wait_for_event
from test_launch import wait_for_workers, worker_and_daemon_on
from test_sgd import ARGS, SGD, check, host_of, reference, sgd_workers


def test_sigstopped_worker_is_failed_within_the_worker_timeout(job, tmp_path):
    """Without the worker timeout the survivors would wait in their allreduce for the
    collective timeout (60 s here), and the next epoch --rendezvous-timeout (60 s) for the
    stopped worker. With it (2 s), the driver fails the stopped worker 2 s after its last
    heartbeat, kills it, and the two survivors finish with the reference model."""
    ev = tmp_path / "events"
    p = job.start(["-np", 3, "--min-np", 2, "-H", "localhost:2,127.0.0.2:1", "--worker-timeout", 2,
                   "--events", ev, SGD, *ARGS, "--step-ms", 40])
    victim = next(pid for pid in sgd_workers(job, 3) if host_of(pid) == "127.0.0.2")
    wait_for_event(job, ev, "epoch_joined")
    time.sleep(0.5)
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for_event(job, ev, "host_blacklisted", host="127.0.0.2", timeout=15)
    detected = time.monotonic() - stopped
    # Its last beat came one interval (0.4 s) before the stop or less, unless a loaded
    # machine delayed the beats before it (slack below); the silence is found within a
    # liveness tick (0.1 s) of the timeout; slack above for a loaded machine.
    assert 1.2 < detected < 3.5, f"failed {detected:.2f} s after SIGSTOP"
    assert gone_within(job, victim), "the stopped worker was not killed"
    out, err = p.communicate(timeout=60)
    check(out, err, p.returncode, 2, reference(), min_epoch=2)
    events = job.events(ev)
    blacklisted = first(events, "host_blacklisted", host="127.0.0.2")
    assert blacklisted["cause"] == "worker_timeout", blacklisted
    assert "sent nothing for" in blacklisted["reason"] and "(--worker-timeout)" in blacklisted["reason"]
    assert first(events, "worker_exited", pid=victim, signal=signal.SIGKILL), events
    assert [e["size"] for e in epochs(events)] == [3, 2]
    assert [e["host"] for e in events if e["event"] == "host_blacklisted"] == ["127.0.0.2"]


def test_slow_worker_is_not_failed(job, tmp_path):
    """Rank 2 spends 3 s in its own code before its first allreduce, three times the
    worker timeout (1 s), while ranks 0 and 1 wait for it inside that allreduce: all three
    keep beating, nobody is failed, and the job runs in one epoch."""
    ev = tmp_path / "events"
    t0 = time.monotonic()
    r = job.run(["-np", 3, "--min-np", 2, "-H", "localhost:2,127.0.0.2:1", "--worker-timeout", 1, "--events", ev,
                 TESTPROG, "--elastic", "--allreduce-seconds", 0.5, "--slow-rank", 2, "--slow-seconds", 3])
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 > 3, "rank 2 was not slow"
    events = job.events(ev)
    assert not first(events, "host_blacklisted"), events
    assert [e["size"] for e in epochs(events)] == [3]
    assert r.stdout.count("done after") == 3


def test_sigstopped_worker_ends_a_fixed_job_promptly(job):
    """Outside elastic mode a silent worker ends the job (exit 1) at the worker timeout,
    naming it, instead of leaving its peer in their allreduce; the stop sequence kills the
    stopped process (a SIGTERM alone would wait for a SIGCONT)."""
    p = job.start(["-np", 2, "-H", "localhost:1,127.0.0.2:1", "--worker-timeout", 1, TESTPROG,
                   "--allreduce-seconds", 30])
    victim, _ = worker_and_daemon_on(wait_for_workers(job, 2), "127.0.0.2")
    time.sleep(1.0)  # joined, allreducing
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    out, err = p.communicate(timeout=30)
    took = time.monotonic() - stopped
    assert p.returncode == 1, err
    said = re.search(r"rank 1 \(host '127\.0\.0\.2', slot 0, pid \d+\) sent nothing for (\d+\.\d) s, not even a "
                     r"heartbeat \(--worker-timeout\)", err)
    # the timeout, plus up to a liveness tick, more where a loaded machine delays the tick
    assert said and 1.0 <= float(said.group(1)) < 4, err
    # 1 s of silence, then the daemons' stop (SIGKILL 2 s after SIGTERM at the latest).
    assert took < 5, f"the job took {took:.1f} s to end after the SIGSTOP"
