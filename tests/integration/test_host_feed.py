"""--host-discovery-fd: host lists pushed over an inherited pipe (what `elasticrun sweep`
does for its trials), with the real binaries: the job follows each list as it arrives,
keeps its hosts through a bad list and after the feed ends, and fails clearly when the
feed ends before naming any host."""
import os
import time

from conftest import EXAMPLES

TRIAL = EXAMPLES / "trial_objective"


def wait_for(pred, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    return None


def epochs(events):
    return [e for e in events if e["event"] == "epoch_started"]


def test_the_job_follows_each_list_as_it_arrives_and_keeps_the_last(job, tmp_path):
    ev = tmp_path / "events"
    r, w = os.pipe()
    p = job.start(["--min-np", 1, "--max-np", 3, "--host-discovery-fd", r, "--events", ev, TRIAL,
                   "--steps", 1000, "--report-every", 5, "--step-ms", 10], pass_fds=[r])
    os.close(r)
    try:
        os.write(w, b"127.0.0.1:1\n\n")
        assert wait_for(lambda: [e for e in job.events(ev) if e["event"] == "report"]), "no first report"
        os.write(w, b"# grown\n127.0.0.1:1\n127.0.0.2:2\n\n")
        # Until the new workers hold the state (a report of epoch 2): then 127.0.0.1 may go.
        assert wait_for(lambda: [e for e in job.events(ev) if e["event"] == "report" and e["epoch"] == 2]), \
            job.events(ev)
        os.write(w, b"127.0.0.1:x\n\n")  # a bad list: reported, hosts kept
        assert wait_for(lambda: [e for e in job.events(ev) if e["event"] == "discovery_error"]), job.events(ev)
        os.write(w, b"127.0.0.2:2\n\n")  # 127.0.0.1 leaves: its worker is stopped
        assert wait_for(lambda: [e for e in epochs(job.events(ev)) if e["epoch"] >= 3]), job.events(ev)
    finally:
        os.close(w)  # the end of the feed: the job keeps 127.0.0.2:2 and finishes
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    events = job.events(ev)
    sizes = [e["size"] for e in epochs(events)]
    assert sizes == [1, 3, 2], (sizes, err)
    assert [e["host"] for e in epochs(events)[-1]["assignment"]] == ["127.0.0.2", "127.0.0.2"]
    errors = [e["message"] for e in events if e["event"] == "discovery_error"]
    assert len(errors) == 2, errors
    assert "line 1: slots 'x' is not a number" in errors[0], errors
    assert errors[1] == f"--host-discovery-fd {r} was closed", errors
    assert "finished at step 1000" in out, out
    # The hosts came from the feed: no discovery process ran.
    assert "discovery script" not in err, err


def test_a_feed_that_ends_before_naming_a_host_fails_the_start(job, tmp_path):
    r, w = os.pipe()
    os.write(w, b"127.0.0.1:1\n")  # no empty line: never a whole list
    os.close(w)
    res = job.run(["--min-np", 1, "--host-discovery-fd", r, TRIAL, "--steps", 5], pass_fds=[r], timeout=30)
    os.close(r)
    assert res.returncode == 3, res.stderr
    assert (f"host discovery failed on its first run: --host-discovery-fd {r} was closed inside a host list"
            in res.stderr), res.stderr


def test_a_descriptor_that_cannot_carry_host_lists_is_a_usage_error(job, tmp_path):
    f = tmp_path / "hosts"
    f.write_text("127.0.0.1:1\n\n")
    fd = os.open(f, os.O_RDONLY)
    try:
        res = job.run(["--host-discovery-fd", fd, TRIAL], pass_fds=[fd], timeout=30)
    finally:
        os.close(fd)
    assert res.returncode == 2, res.stderr
    assert f"--host-discovery-fd {fd}: not a pipe or a stream socket" in res.stderr, res.stderr
    res = job.run(["--host-discovery-fd", 99, TRIAL], timeout=30)
    assert res.returncode == 2 and "--host-discovery-fd 99: not an open file descriptor" in res.stderr, res.stderr
