"""Worker -> driver reports (elasticrun::report, --events, --report-fd) with the real
binaries: examples/trial_objective reports every few steps and stops when told; the test
plays the sweep on the other end of a socket pair passed as --report-fd."""
import json
import math
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, our_processes

TRIAL = EXAMPLES / "trial_objective"
HOSTS = "localhost:2,127.0.0.2:1,127.0.0.3:1"


def loss_at(step, lr=0.01, momentum=0.5):
    """trial_objective's objective."""
    return (math.log10(lr) + 1) ** 2 + (momentum - 0.9) ** 2 + math.exp(-step / 50)


def reports(events):
    return [e for e in events if e["event"] == "report"]


def ends(out):
    """{rank: (stopped|finished, step)} from trial_objective's last lines."""
    return {int(r): (how, int(s)) for r, how, s in re.findall(r"rank (\d+) (stopped|finished) at step (\d+)", out)}


class Sweep:
    """The other end of --report-fd: answers every report with decide(step) ('continue'
    or 'stop', or any line to send as it is) and keeps what it was sent."""

    def __init__(self, decide):
        self.ours, self.theirs = socket.socketpair()
        self.decide = decide
        self.seen = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        f = self.ours.makefile("rwb", buffering=0)
        for line in f:
            report = json.loads(line)
            self.seen.append(report)
            d = self.decide(report["step"])
            if d is None:
                break
            answer = d if d not in ("continue", "stop") else json.dumps({"step": report["step"], "decision": d})
            try:
                f.write(answer.encode() + b"\n")
            except OSError:
                break
        self.ours.close()

    def fd(self):
        return self.theirs.fileno()

    def close(self):
        self.theirs.close()  # ours goes when elasticrun's copy closes and the thread ends
        self.thread.join(timeout=10)


def test_report_events_carry_rank_0s_metrics_at_every_reported_step(job, tmp_path):
    ev = tmp_path / "events"
    r = job.run(["-np", 3, "--events", ev, TRIAL, "--steps", 40, "--report-every", 5])
    assert r.returncode == 0, r.stderr
    got = reports(job.events(ev))
    assert [e["step"] for e in got] == list(range(5, 41, 5)), got
    for e in got:
        assert e["epoch"] == 1 and e["size"] == 3, e
        assert e["metrics"]["rank"] == 0, e  # every rank reports its own rank: the driver takes rank 0's
        assert e["metrics"]["loss"] == pytest.approx(loss_at(e["step"]), rel=1e-12), e
    assert ends(r.stdout) == {0: ("finished", 40), 1: ("finished", 40), 2: ("finished", 40)}, r.stdout


def test_stop_decision_ends_every_rank_at_the_same_step(job, tmp_path):
    sweep = Sweep(lambda step: "stop" if step >= 25 else "continue")
    try:
        r = job.run(["-np", 3, "-H", HOSTS, "--report-fd", sweep.fd(), TRIAL, "--steps", 1000, "--report-every", 5],
                    pass_fds=[sweep.fd()])
    finally:
        sweep.close()
    assert r.returncode == 0, r.stderr
    assert ends(r.stdout) == {0: ("stopped", 25), 1: ("stopped", 25), 2: ("stopped", 25)}, r.stdout
    assert [s["step"] for s in sweep.seen] == [5, 10, 15, 20, 25], sweep.seen
    assert all(s["size"] == 3 and s["epoch"] == 1 and set(s["metrics"]) == {"loss", "rank"} for s in sweep.seen)


def trial_workers(job, n, timeout=20):
    """[(host, pid)] of the job's trial_objective workers once `n` are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for p in our_processes(job.tag):
            try:
                if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/trial_objective"):
                    env = Path(f"/proc/{p}/environ").read_bytes()
                    found.append((env.split(b"ELASTICRUN_HOST=")[1].split(b"\0")[0].decode(), p))
            except (OSError, IndexError):
                pass
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{n} trial_objective workers did not start")


def test_decision_still_reaches_every_rank_after_a_reset(job, tmp_path):
    """A worker is SIGKILLed between reports; the survivors restore, re-join epoch 2 and
    go on reporting, and the stop at step 150 still ends every one of them there."""
    ev = tmp_path / "events"
    sweep = Sweep(lambda step: "stop" if step >= 150 else "continue")
    try:
        p = job.start(["-np", 4, "--min-np", 2, "-H", HOSTS, "--events", ev, "--report-fd", sweep.fd(), TRIAL,
                       "--steps", 100000, "--report-every", 5, "--step-ms", 10], pass_fds=[sweep.fd()])
        on = trial_workers(job, 4)
        deadline = time.monotonic() + 30
        while not any(s["step"] >= 40 for s in sweep.seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Between two reports (every 50 ms): the report of step 40 was answered, the one
        # of 45 not yet sent.
        time.sleep(0.02)
        victim = dict(on)["127.0.0.3"]
        os.kill(victim, signal.SIGKILL)
        out, err = p.communicate(timeout=90)
    finally:
        sweep.close()
    assert p.returncode == 0, err[-3000:]
    got = reports(job.events(ev))
    epochs = [e["epoch"] for e in got]
    assert epochs == sorted(epochs) and epochs[-1] == 2, got  # reports went on in the new epoch
    assert got[-1]["step"] == 150 and got[-1]["size"] == 3, got[-1]
    assert ends(out) == {0: ("stopped", 150), 1: ("stopped", 150), 2: ("stopped", 150)}, out
    assert sweep.seen[-1]["step"] == 150


@pytest.mark.parametrize("value,message", [
    ("three", "--report-fd 'three': expected a file descriptor number"),
    ("77", "--report-fd 77: not an open file descriptor"),
])
def test_bad_report_fd_is_a_usage_error(job, value, message):
    r = job.run(["-np", 1, "--report-fd", value, TRIAL, "--steps", 1])
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


@pytest.mark.parametrize("answer", ["garbage", "wrong-step", "closed"])
def test_a_sweep_that_answers_nonsense_or_goes_away_lets_the_job_finish(job, answer, tmp_path):
    decide = {"garbage": lambda step: "this is not JSON",
              "wrong-step": lambda step: json.dumps({"step": step + 1, "decision": "stop"}),
              "closed": lambda step: None}[answer]
    ev = tmp_path / "events"
    sweep = Sweep(decide)
    try:
        r = job.run(["-np", 2, "--events", ev, "--report-fd", sweep.fd(), TRIAL, "--steps", 30, "--report-every", 5],
                    pass_fds=[sweep.fd()])
    finally:
        sweep.close()
    assert r.returncode == 0, r.stderr
    assert ends(r.stdout) == {0: ("finished", 30), 1: ("finished", 30)}, r.stdout
    assert len(sweep.seen) == 1  # asked once; every later report was answered continue
    assert [e["step"] for e in reports(job.events(ev))] == [5, 10, 15, 20, 25, 30]
    assert r.stderr.count('answered "continue" from now on') == 1, r.stderr


def test_trial_objective_resumes_from_its_checkpoint(job, tmp_path):
    """With ELASTICRUN_TRIAL_DIR, rank 0 checkpoints at every report and a new run starts
    where the last one committed (what a resumed sweep relies on)."""
    trial = tmp_path / "trial"
    trial.mkdir()
    env = {"ELASTICRUN_TRIAL_DIR": str(trial), "ELASTICRUN_TRIAL_CONFIG": '{"lr": 0.1, "momentum": 0.9}'}
    r = job.run(["-np", 2, TRIAL, "--steps", 20, "--report-every", 5], env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads((trial / "checkpoint.json").read_text())["step"] == 20
    ev = tmp_path / "events"
    r = job.run(["-np", 2, "--events", ev, TRIAL, "--steps", 30, "--report-every", 5], env=env)
    assert r.returncode == 0, r.stderr
    got = reports(job.events(ev))
    assert [e["step"] for e in got] == [25, 30], got
    assert got[-1]["metrics"]["loss"] == pytest.approx(math.exp(-30 / 50), rel=1e-12)  # the optimum: q = 0
    assert ends(r.stdout) == {0: ("finished", 30), 1: ("finished", 30)}
