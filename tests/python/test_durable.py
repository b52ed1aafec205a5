"""Durable checkpoints of the Python states (elasticrun --checkpoint-dir): an ObjectState
job whose every worker is SIGKILLed at once goes on from the newest checkpoint and ends
with the reference model; a TorchState job (model, optimizer momentum, counters) whose
driver was SIGKILLed resumes in a new run and ends with exactly the parameters of an
uninterrupted run."""
import json
import os
import signal
import time

from conftest import HERE, run_python, start_python, wait_for_checkpoints, workers_of
from test_elastic_state import reference

NUMPY = HERE / "workers" / "elastic_numpy.py"
TORCH = HERE / "workers" / "torch_durable.py"
HOSTS4 = ["-H", "localhost:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"]


def events_of(path, kind):
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def finals(out):
    return [l.split(": ", 1)[1] for l in out.splitlines() if "]<stdout>: final " in l]


def test_object_state_total_loss_goes_on_from_the_newest_checkpoint(job, tmp_path):
    ck, ev = tmp_path / "ck", tmp_path / "events"
    p = start_python(job, [*HOSTS4, "-np", 2, "--min-np", 2, "--max-np", 2, "--events", ev, "--checkpoint-dir", ck,
                           "--checkpoint-every", 2], NUMPY, 150, "--step-ms", 15)
    pids = workers_of(job, "elastic_numpy.py", 2)
    wait_for_checkpoints(ck, 2)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    got = finals(out)
    assert len(got) == 2 and all(g == reference(150) for g in got), (got, err[-2000:])
    restored = events_of(ev, "checkpoint_restored")
    assert len(restored) == 1 and restored[0]["commit"] >= 2, restored
    assert [r["from_checkpoint"] for r in events_of(ev, "reset")][-1] is True


def test_torch_state_resumes_in_a_new_run(job, tmp_path):
    ck, ev = tmp_path / "ck", tmp_path / "events"
    hosts = ["-H", "localhost:1,127.0.0.2:1"]
    want = run_python(job, hosts, TORCH, 60)
    assert want.returncode == 0, want.stderr[-3000:]
    want = finals(want.stdout)
    assert len(want) == 2 and want[0] == want[1], want
    p = start_python(job, [*hosts, "--checkpoint-dir", ck, "--checkpoint-every", 5], TORCH, 60, "--step-ms", 30)
    wait_for_checkpoints(ck, 2)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    r = run_python(job, [*hosts, "--events", ev, "--checkpoint-dir", ck], TORCH, 60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert finals(r.stdout) == want, (finals(r.stdout), want, r.stderr[-2000:])
    restored = events_of(ev, "checkpoint_restored")
    assert len(restored) == 1 and restored[0]["commit"] >= 5, restored
    first = [l for l in r.stdout.splitlines() if "committed step" in l][0]
    assert int(first.rsplit(" ", 1)[1]) == restored[0]["commit"] + 1, (first, restored)


def test_torch_state_sigterm_leaves_a_checkpoint_of_the_next_commit(job, tmp_path):
    """elasticrun gets SIGTERM (a scheduler ending the job) with no checkpoint due by count
    or time: the Python State's next commit is written all the same (checkpoint_due goes
    through the library's Durable), elasticrun exits 143, and a new run goes on from that
    commit to exactly the parameters of an uninterrupted run."""
    ck, ev = tmp_path / "ck", tmp_path / "events"
    hosts = ["-H", "localhost:1,127.0.0.2:1"]
    want = run_python(job, hosts, TORCH, 60)
    assert want.returncode == 0, want.stderr[-3000:]
    want = finals(want.stdout)
    p = start_python(job, [*hosts, "--events", ev, "--checkpoint-dir", ck, "--checkpoint-every", 0,
                           "--checkpoint-interval", 3600, "--preempt-grace", 10], TORCH, 60, "--step-ms", 30)
    deadline = time.monotonic() + 60
    while not (ev.exists() and events_of(ev, "state_synced")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err[-3000:]
    saved = events_of(ev, "checkpoint_saved")
    assert len(saved) == 1 and saved[0]["requested"] is True and saved[0]["commit"] >= 1, saved
    assert not finals(out), out[-1000:]
    r = run_python(job, [*hosts, "--checkpoint-dir", ck], TORCH, 60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert finals(r.stdout) == want, (finals(r.stdout), want, r.stderr[-2000:])
    first = [l for l in r.stdout.splitlines() if "committed step" in l][0]
    assert int(first.rsplit(" ", 1)[1]) == saved[0]["commit"] + 1, (first, saved)
