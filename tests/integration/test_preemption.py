"""Preemption (--preempt-grace with --checkpoint-dir): a SIGTERM, which is how schedulers end
a job before their SIGKILL, makes the workers' next commit a durable checkpoint, and
elasticrun stops once it is written (exit 143); the next run with the same directory goes
on from that commit and ends with the model of an uninterrupted run. A daemon's own SIGTERM
(Slurm signals every step's task; a pod being deleted) asks for the same checkpoint, and the
job goes on without that host once the grace is over. Without a committed state to save,
SIGTERM stops at once; a second signal never waits."""
import os
import signal
import time

from conftest import checkpoints, wait_for_progress
from test_sgd import SGD, finals, reference

# No checkpoint by count or by time: any checkpoint in these tests is the one a SIGTERM asked for.
ONLY_ON_REQUEST = ["--checkpoint-every", 0, "--checkpoint-interval", 3600]
ARGS = ["--steps", 400, "--dim", 64, "--batch", 48, "--commit-every", 5]


def of_kind(events, kind):
    return [e for e in events if e["event"] == kind]


def committed_steps(out):
    return [int(l.split("committed step ")[1].split()[0]) for l in out.splitlines() if "committed step " in l]


def test_sigterm_leaves_a_checkpoint_of_the_last_commit_and_the_next_run_resumes(job, tmp_path):
    ck, ev, progress = tmp_path / "ck", tmp_path / "events", tmp_path / "progress"
    p = job.start(["-np", 2, "--events", ev, "--checkpoint-dir", ck, *ONLY_ON_REQUEST, "--preempt-grace", 10, SGD,
                   *ARGS, "--step-ms", 10, "--progress-file", progress])
    wait_for_progress(progress, 100, p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err[-3000:]
    events = job.events(ev)
    kinds = [e["event"] for e in events]
    assert "preempting" in kinds, kinds
    saved = of_kind(events, "checkpoint_saved")
    assert len(saved) == 1 and saved[0]["requested"] is True, saved
    assert kinds.index("preempting") < kinds.index("checkpoint_saved") < kinds.index("job_finished"), kinds
    commit = saved[0]["commit"]
    # The first commit after the signal: past the step seen before it, and no further
    # than one past the last one rank 0 printed: the driver stops the workers once the
    # checkpoint is saved, which can fall between rank 0's commit() and its line.
    assert 100 // 5 <= commit <= max(committed_steps(out)) // 5 + 1, (commit, committed_steps(out)[-3:])
    assert checkpoints(ck) == [f"commit-{commit:020d}.ckpt"], checkpoints(ck)
    assert f"commit {commit} is in checkpoint {ck}/" in err, err[-2000:]
    finished = of_kind(events, "job_finished")[0]
    assert finished["status"] == 143, finished

    r = job.run(["-np", 2, "--events", ev, "--checkpoint-dir", ck, SGD, *ARGS], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"rank 0 restored commit {commit} from {ck}/" in r.stderr, r.stderr[-2000:]
    assert committed_steps(r.stdout)[0] == commit * 5 + 5, committed_steps(r.stdout)[:3]
    assert finals(r.stdout) == [reference(ARGS)] * 2, r.stdout[-2000:]


def test_a_daemons_sigterm_saves_a_checkpoint_and_the_job_goes_on_without_its_host(job, tmp_path):
    """The daemon of 127.0.0.2 gets SIGTERM (as Slurm's steps do): the driver hears of it,
    asks for a checkpoint, and the host's worker keeps training for --preempt-grace; then
    the daemon stops it and the job finishes on localhost with the reference model."""
    ck, ev, progress = tmp_path / "ck", tmp_path / "events", tmp_path / "progress"
    p = job.start(["-np", 2, "--min-np", 1, "-H", "localhost:1,127.0.0.2:1", "--events", ev, "--checkpoint-dir", ck,
                   *ONLY_ON_REQUEST, "--preempt-grace", 2, SGD, *ARGS, "--step-ms", 10, "--progress-file", progress])
    wait_for_progress(progress, 50, p)
    started = [e for e in job.events(ev) if e["event"] == "worker_started" and e["host"] == "127.0.0.2"]
    assert len(started) == 1, started
    daemon = int(open(f"/proc/{started[0]['pid']}/stat").read().rsplit(")", 1)[1].split()[1])
    assert open(f"/proc/{daemon}/cmdline").read().split("\0")[0].endswith("elasticrund"), daemon
    signalled = time.monotonic()
    os.kill(daemon, signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    assert finals(out) == [reference(ARGS)], out[-2000:]
    events = job.events(ev)
    preempted = of_kind(events, "host_preempted")
    assert [(e["host"], e["signal"]) for e in preempted] == [("127.0.0.2", 15)], preempted
    saved = of_kind(events, "checkpoint_saved")
    assert len(saved) == 1 and saved[0]["requested"] and saved[0]["commit"] >= 10, saved
    # The worker's end, as the driver saw it first: the daemon's report of its exit (by
    # the daemon's SIGTERM), or, on a loaded machine, its rendezvous connection closing
    # before that report was read, which fails the host; the daemon's link is then
    # stopped and the exit is not in the events (a gap noted on issue 32's stop note).
    exited = [e for e in of_kind(events, "worker_exited") if e["host"] == "127.0.0.2"]
    lost = [e for e in of_kind(events, "host_blacklisted") if e["host"] == "127.0.0.2"]
    assert (len(exited) == 1 and exited[0]["signal"] == 15) or (
        not exited and len(lost) == 1 and lost[0]["cause"] == "connection_lost"), (exited, lost)
    left = exited[0] if exited else lost[0]
    # It trained on for the grace: it left 2 s after the signal, not at once.
    assert left["t"] - preempted[0]["t"] >= 1.8, (preempted, left)
    assert "127.0.0.2: its daemon got signal 15" in err, err[-2000:]
    assert time.monotonic() - signalled >= 2


def test_sigterm_without_a_committed_state_stops_at_once(job, tmp_path):
    """A program that keeps no elastic State has nothing to save: no wait."""
    p = job.start(["-np", 1, "--events", tmp_path / "ev", "--checkpoint-dir", tmp_path / "ck", "--preempt-grace", 30,
                   "sleep", 60])
    time.sleep(1)
    start = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert time.monotonic() - start < 10
    assert "preempting" not in [e["event"] for e in job.events(tmp_path / "ev")]


def test_no_commit_within_the_grace_or_a_second_signal_stops_without_a_checkpoint(job, tmp_path):
    """Commits 30 steps apart at 100 ms a step: the checkpoint would come 3 s later. With
    --preempt-grace 1 the job stops after the grace; with a second SIGTERM, at once."""
    for second, grace in ((False, 1), (True, 30)):
        ck, ev, progress = tmp_path / f"ck{grace}", tmp_path / f"ev{grace}", tmp_path / f"progress{grace}"
        p = job.start(["-np", 2, "--events", ev, "--checkpoint-dir", ck, *ONLY_ON_REQUEST, "--preempt-grace", grace,
                       SGD, "--steps", 100000, "--dim", 64, "--batch", 48, "--commit-every", 30, "--step-ms", 100,
                       "--progress-file", progress])
        wait_for_progress(progress, 30, p)
        time.sleep(0.3)
        start = time.monotonic()
        p.send_signal(signal.SIGTERM)
        if second:
            time.sleep(0.3)
            p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - start
        assert p.returncode == 143, err[-3000:]
        assert checkpoints(ck) == [], checkpoints(ck)
        if second:
            assert took < 2.5, took
            assert "interrupted by SIGTERM; stopping all workers" in err, err[-2000:]
        else:
            assert 0.9 <= took < 2.5, took
            assert "no checkpoint within 1.0 s" in err, err[-2000:]


def test_bad_preempt_grace_is_a_usage_error(job, tmp_path):
    for args, want in [
        (["--preempt-grace", 5], "--preempt-grace need --checkpoint-dir"),
        (["--checkpoint-dir", tmp_path / "ck", "--preempt-grace", -1], "--preempt-grace must be"),
        (["--checkpoint-dir", tmp_path / "ck", "--preempt-grace", 3601], "--preempt-grace must be at most 3600"),
    ]:
        r = job.run([*args, "-np", 1, "true"], timeout=30)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert want in r.stderr, (args, r.stderr)
