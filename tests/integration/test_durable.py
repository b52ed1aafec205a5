"""Durable checkpoints (--checkpoint-dir): a job whose every worker is SIGKILLed at once goes
on from the newest checkpoint on disk and still ends with the reference model; a driver
killed and started again with the same directory resumes; a checkpoint torn or corrupted
on disk is passed over for the previous one; a directory that cannot be written is a usage
error before anything runs."""
import os
import re
import signal
import time

import pytest

from conftest import checkpoints, our_processes, wait_for_checkpoints
from test_sgd import HOSTS, SGD, finals, reference, sgd_workers

ARGS = ["--steps", 150, "--dim", 64, "--batch", 48, "--commit-every", 5]


def of_kind(events, kind):
    return [e for e in events if e["event"] == kind]


def test_total_loss_goes_on_from_the_newest_checkpoint(job, tmp_path):
    """Both workers SIGKILLed at the same moment: no survivor holds the state. The two spare
    hosts take over, rank 0 restores the newest checkpoint, and the job ends with the
    model of an uninterrupted run (the commit log is part of the tracked state, so it must
    match too: no committed step counted twice)."""
    ck, ev = tmp_path / "ck", tmp_path / "events"
    p = job.start(["-np", 2, "--min-np", 2, "--max-np", 2, "-H", HOSTS, "--events", ev, "--checkpoint-dir", ck,
                   "--checkpoint-every", 2, SGD, *ARGS, "--step-ms", 10])
    pids = sgd_workers(job, 2)
    wait_for_checkpoints(ck, 2)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-4000:]
    # The driver may see the two deaths one at a time: then the epoch that replaced the
    # first one's worker never formed, and its new worker holds no state either.
    assert re.search(r"every worker holding the job's state is gone: epoch \d restores from the newest durable "
                     r"checkpoint", err), err[-3000:]
    got = finals(out)
    assert len(got) == 2 and all(g == reference(ARGS) for g in got), (got, err[-3000:])
    events = job.events(ev)
    resets = of_kind(events, "reset")
    assert [r["from_checkpoint"] for r in resets][-1:] == [True], resets
    assert sum(r["from_checkpoint"] for r in resets) == 1, resets
    restored = of_kind(events, "checkpoint_restored")
    assert len(restored) == 1, restored
    assert restored[0]["rank"] == 0 and restored[0]["commit"] >= 2, restored
    assert restored[0]["path"].startswith(str(ck)), restored
    # The newest checkpoint the driver had heard of, or a newer one: the kill can land
    # between a checkpoint's rename and its checkpoint_saved report.
    heard = [e["commit"] for e in events[:events.index(restored[0])] if e["event"] == "checkpoint_saved"]
    assert heard and restored[0]["commit"] >= max(heard), (restored, heard)
    assert f"rank 0 restored commit {restored[0]['commit']} from " in err
    # The last restore point is what is lost at most: rank 0 trained on from there.
    print(f"total loss -> restored commit {restored[0]['commit']} in "
          f"{time.monotonic() - killed_at:.2f} s to the end of the job")


def test_a_new_run_with_the_same_directory_resumes(job, tmp_path):
    """The driver itself is SIGKILLed (its workers follow it); a new elasticrun with the
    same --checkpoint-dir starts from the newest checkpoint, not from step 0."""
    ck, ev = tmp_path / "ck", tmp_path / "events"
    p = job.start(["-np", 2, "-H", "localhost:1,127.0.0.2:1", "--checkpoint-dir", ck, "--checkpoint-every", 2, SGD,
                   *ARGS, "--step-ms", 10])
    wait_for_checkpoints(ck, 2)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    # Its workers outlive it briefly (their daemon stops them) and may save once more.
    deadline = time.monotonic() + 10
    while our_processes(job.tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not our_processes(job.tag), "the killed driver's workers did not stop"
    newest = checkpoints(ck)[-1]
    r = job.run(["-np", 2, "-H", "localhost:1,127.0.0.2:1", "--events", ev, "--checkpoint-dir", ck, SGD, *ARGS],
                timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = finals(r.stdout)
    assert len(got) == 2 and all(g == reference(ARGS) for g in got), (got, r.stderr[-3000:])
    restored = of_kind(job.events(ev), "checkpoint_restored")
    assert len(restored) == 1 and restored[0]["path"].endswith(newest), (restored, newest)
    first = [l for l in r.stdout.splitlines() if "committed step" in l][0]
    assert int(first.split("committed step ")[1].split()[0]) > 5, "the new run trained from the start: " + first


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_checkpoint_is_passed_over(job, tmp_path, damage):
    ck, ev = tmp_path / "ck", tmp_path / "events"
    # Two runs, the second resuming the first: each ends with a checkpoint of its last
    # commit (6, then 12), so at least two files are there, the newest two kept.
    for steps in (30, 60):
        r = job.run(["-np", 2, "--checkpoint-dir", ck, "--checkpoint-every", 1, SGD, "--steps", steps, "--dim", 64,
                     "--batch", 48, "--commit-every", 5])
        assert r.returncode == 0, r.stderr[-3000:]
    names = checkpoints(ck)
    assert len(names) == 2 and names[1] == "commit-00000000000000000012.ckpt", names
    older, newest = ck / names[0], ck / names[1]
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    else:
        newest.write_bytes(data[:-20] + bytes([data[-20] ^ 0x01]) + data[-19:])
    r = job.run(["-np", 2, "--checkpoint-dir", ck, "--events", ev, SGD, *ARGS], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = finals(r.stdout)
    assert len(got) == 2 and all(g == reference(ARGS) for g in got), (got, r.stderr[-3000:])
    events = job.events(ev)
    skipped = of_kind(events, "checkpoint_skipped")
    assert [s["path"] for s in skipped] == [str(newest)], skipped
    assert ("truncated" if damage == "truncate" else "checksum") in skipped[0]["reason"], skipped
    restored = of_kind(events, "checkpoint_restored")
    assert [x["path"] for x in restored] == [str(older)], restored
    assert f"skipped checkpoint {newest}" in r.stderr


def test_bad_checkpoint_flags_are_usage_errors(job, tmp_path):
    (tmp_path / "file").write_text("x")
    for args, want in [
        (["--checkpoint-dir", "/proc/elasticrun-ck"], "--checkpoint-dir: cannot create '/proc/elasticrun-ck'"),
        (["--checkpoint-dir", tmp_path / "file"], "--checkpoint-dir: cannot create"),
        (["--checkpoint-every", 5], "--checkpoint-every, --checkpoint-interval and --preempt-grace need --checkpoint-dir"),
        (["--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", 0, "--checkpoint-interval", 0],
         "no checkpoint would ever be written"),
        (["--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", -1], "--checkpoint-every must be"),
        (["--checkpoint-dir", tmp_path / "ck", "--checkpoint-interval", -1], "--checkpoint-interval must be"),
    ]:
        r = job.run([*args, "-np", 1, "true"], timeout=30)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert want in r.stderr, (args, r.stderr)
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())
