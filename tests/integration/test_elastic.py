"""Elastic jobs: real processes killed with real signals, hosts coming and going through a
real discovery script, on loopback "hosts". Each test bounds the time to recover and, via
the job fixture, checks that no process or shared-memory segment is left behind."""
import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import ELASTICRUND, TESTPROG, gone_within, our_processes
from conftest import discovery_script as discovery
from test_launch import argv0, wait_for_workers, worker_and_daemon_on

HOSTS3 = "localhost:2,127.0.0.2:1,127.0.0.3:1"


def first(events, name, **match):
    for e in events:
        if e["event"] == name and all(e.get(k) == v for k, v in match.items()):
            return e
    return None


def per_host_wrapper(tmp_path, before):
    """A worker command that runs `before[host]` (shell) on those hosts, then testprog."""
    wrapper = tmp_path / "per-host.sh"
    lines = ["#!/bin/sh"] + [f'[ "$ELASTICRUN_HOST" = {h} ] && {{ {cmd}; }}' for h, cmd in before.items()]
    wrapper.write_text("\n".join(lines + [f'exec {TESTPROG} "$@"']) + "\n")
    wrapper.chmod(0o755)
    return wrapper


def wait_for_event(job, path, name, timeout=20, **match):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if first(job.events(path), name, **match):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {name} {match} within {timeout} s: {job.events(path)}")


def epochs(events):
    return [e for e in events if e["event"] == "epoch_started"]


def recovery_seconds(events, epoch):
    """Time from the failure that started `epoch` to every worker having joined it."""
    start = first(events, "epoch_started", epoch=epoch)
    joined = first(events, "epoch_joined", epoch=epoch)
    assert start and joined, events
    blacklisted = [e for e in events if e["event"] == "host_blacklisted" and e["t"] <= start["t"]]
    return joined["t"] - (blacklisted[-1]["t"] if blacklisted else start["t"])


@pytest.mark.parametrize("fail_rank", [2, 0])
def test_killed_worker_job_continues_without_restarting_survivors(job, tmp_path, fail_rank):
    ev = tmp_path / "events"
    r = job.run(["-np", 4, "--min-np", 2, "-H", HOSTS3, "--events", ev, TESTPROG, "--elastic",
                 "--allreduce-seconds", 3, "--fail-rank", fail_rank, "--fail-signal", 9])
    assert r.returncode == 0, r.stderr
    events = job.events(ev)
    e = epochs(events)
    # Rank 2 is alone on 127.0.0.2; rank 0 shares localhost with rank 1, and a failed
    # host is blacklisted with all its workers.
    survivors = 3 if fail_rank == 2 else 2
    assert [x["size"] for x in e] == [4, survivors], e
    assert e[1]["kind"] == "abort"
    # Survivors were not restarted: exactly four workers were ever started.
    assert sum(1 for x in events if x["event"] == "worker_started") == 4
    assert r.stdout.count("rejoined epoch 2") == survivors
    assert r.stdout.count("done after") == survivors
    assert recovery_seconds(events, 2) < 2.0
    assert "blacklisting host" in r.stderr


def test_sigstopped_worker_is_failed_after_rendezvous_timeout(job, tmp_path):
    """A SIGSTOPped worker neither re-joins nor exits: after another worker's failure
    starts a new epoch, it is declared failed after --rendezvous-timeout and killed. (With
    the worker timeout off: this is the bound when nothing else notices the silence.)"""
    ev = tmp_path / "events"
    p = job.start(["-np", 4, "--min-np", 2, "-H", HOSTS3, "--rendezvous-timeout", 1.5, "--worker-timeout", 0,
                   "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 6])
    pids = wait_for_workers(job, 4)
    time.sleep(0.5)
    on = {Path(f"/proc/{pid}/environ").read_bytes().split(b"ELASTICRUN_HOST=")[1].split(b"\0")[0]: pid for pid in pids}
    os.kill(on[b"127.0.0.2"], signal.SIGSTOP)
    os.kill(on[b"127.0.0.3"], signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    events = job.events(ev)
    late = [e for e in events if e["event"] == "host_blacklisted" and e["host"] == "127.0.0.2"]
    assert late and "did not join epoch" in late[0]["reason"], events
    assert [x["size"] for x in epochs(events)][-1] == 2
    assert out.count("done after") == 2


def test_worker_still_starting_keeps_its_start_timeout_in_a_later_epoch(job, tmp_path):
    """The worker on 127.0.0.2 takes 4 s to start; the one on 127.0.0.3 exits 1 after 1 s,
    which starts epoch 2 long before the first has ever joined. A worker that never joined
    is still starting: it has --start-timeout (20 s) from its spawn, not the
    --rendezvous-timeout (2 s) of re-joins, and the job finishes with it."""
    ev = tmp_path / "events"
    wrapper = per_host_wrapper(tmp_path, {"127.0.0.3": "sleep 1; exit 1", "127.0.0.2": "sleep 4"})
    r = job.run(["-np", 4, "--min-np", 2, "-H", HOSTS3, "--start-timeout", 20, "--rendezvous-timeout", 2,
                 "--events", ev, wrapper, "--elastic", "--allreduce-seconds", 1], timeout=90)
    assert r.returncode == 0, r.stderr
    events = job.events(ev)
    assert [e["host"] for e in events if e["event"] == "host_blacklisted"] == ["127.0.0.3"], events
    assert [x["size"] for x in epochs(events)][-1] == 3, events
    assert r.stdout.count("done after") == 3


def test_killed_daemon_fails_its_host_only(job, tmp_path):
    ev = tmp_path / "events"
    p = job.start(["-np", 3, "--min-np", 2, "-H", "localhost:2,127.0.0.2:1", "--events", ev, TESTPROG,
                   "--elastic", "--allreduce-seconds", 4])
    wait_for_workers(job, 3)
    daemons = [pid for pid in our_processes(job.tag) if argv0(pid).endswith(b"elasticrund")]
    assert len(daemons) == 2
    _, daemon = worker_and_daemon_on(wait_for_workers(job, 3), "127.0.0.2")
    os.kill(daemon, signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    # Whichever the driver notices first: the worker's lost connection or the daemon's.
    assert re.search(r"blacklisting host '127\.0\.0\.2'|host '127\.0\.0\.2' lost its daemon.*blacklisting it", err), err
    assert out.count("done after") == 2
    assert [x["size"] for x in epochs(job.events(ev))] == [3, 2]


def test_stopped_daemon_is_taken_for_gone_after_host_timeout(job, tmp_path):
    """A SIGSTOPped daemon closes nothing and its kernel still answers TCP keep-alives, as
    a host behind a cut link answers nothing at all: only its missing heartbeats tell.
    After --host-timeout (2 s here) the driver fails that host; the others go on. Once
    continued, the daemon finds its channel closed and stops its worker."""
    ev = tmp_path / "events"
    p = job.start(["-np", 3, "--min-np", 2, "-H", "localhost:2,127.0.0.2:1", "--host-timeout", 2, "--events", ev,
                   TESTPROG, "--elastic", "--allreduce-seconds", 8])
    child, daemon = worker_and_daemon_on(wait_for_workers(job, 3), "127.0.0.2")
    wait_for_event(job, ev, "epoch_joined")
    os.kill(daemon, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for_event(job, ev, "host_blacklisted", host="127.0.0.2", timeout=10)
        detected = time.monotonic() - stopped
    finally:
        os.kill(daemon, signal.SIGCONT)
    # 2 s of silence, noticed at the driver's next heartbeat tick (every 0.5 s), with
    # slack for a loaded machine; the stop came right after a heartbeat at the earliest
    # (0.5 s after the one before it, later when a loaded machine delayed that one).
    assert 1.2 < detected < 5, f"detected after {detected:.2f} s"
    assert gone_within(job, child), "the continued daemon left its worker running"
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert re.search(r"host '127\.0\.0\.2' lost its daemon: heard nothing from it for [2-4]\.\d s \(--host-timeout\)", err), err
    assert out.count("done after") == 2
    assert [x["size"] for x in epochs(job.events(ev))] == [3, 2]


def test_daemon_that_never_answers_is_given_up_after_host_timeout(job, tmp_path):
    """A daemon that starts but never answers (a hung start, a wrong program behind
    --daemon-path) is given up after --host-timeout (2 s here), with the reason, and the
    job goes on without its host: not after the 60 s join timeout, and the shutdown does
    not wait for it. Here one of the two daemons reads its control channel and never
    writes: the one whose shell reaches `mkdir` second. The driver starts rank 0's host's
    first, but on a loaded machine the other shell can run first (CI saw localhost's go
    deaf), so the test finds the deaf host in the events and requires the job to finish on
    the other."""
    marks = tmp_path / "marks"
    marks.mkdir()
    deaf = tmp_path / "deaf-daemon.sh"
    deaf.write_text(f"""#!/bin/sh
if mkdir {marks}/first 2>/dev/null; then exec {ELASTICRUND} "$@"; fi
if mkdir {marks}/second 2>/dev/null; then cat >/dev/null; exit 0; fi
exec {ELASTICRUND} "$@"
""")
    deaf.chmod(0o755)
    ev = tmp_path / "events"
    t0 = time.monotonic()
    r = job.run(["-np", 2, "--min-np", 1, "-H", "localhost:1,127.0.0.2:1", "--host-timeout", 2, "--daemon-path", deaf,
                 "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 2])
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert (marks / "second").exists(), "the deaf daemon was not started"
    events = job.events(ev)
    failed = [e for e in events if e["event"] == "host_blacklisted"]
    assert len(failed) == 1 and \
        failed[0]["reason"] == "could not start its daemon: it did not answer within 2.0 s (--host-timeout)", events
    assert failed[0]["t"] < 10, failed
    deaf_host = failed[0]["host"]
    alive = {"localhost": "127.0.0.2", "127.0.0.2": "localhost"}[deaf_host]
    assert epochs(events)[-1]["assignment"] == [{"host": alive, "rank": 0, "slot": 0}], events
    assert took < 30, f"the job took {took:.1f} s"
    assert r.stdout.count("done after") == 1


def test_reset_limit_exceeded_fails_the_job(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1", "127.0.0.3:1"])
    p = job.start(["-np", 3, "--min-np", 1, "--host-discovery-script", script, "--discovery-interval", 0.2,
                   "--reset-limit", 1, TESTPROG, "--elastic", "--allreduce-seconds", 30])
    wait_for_workers(job, 3)
    hosts.write_text("localhost:1\n127.0.0.2:1\n")       # reset 1
    time.sleep(1.5)
    hosts.write_text("localhost:1\n")                    # reset 2: over the limit
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1, err
    assert "reset limit 1 reached" in err


def test_host_added_by_discovery_joins_without_restarting_anyone(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1"])
    ev = tmp_path / "events"
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.2,
                   "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 5])
    wait_for_workers(job, 2)
    wait_for_event(job, ev, "epoch_joined", epoch=1)  # the soft notice is for a formed epoch
    hosts.write_text("localhost:1\n127.0.0.2:1\n127.0.0.3:1\n")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    events = job.events(ev)
    e = epochs(events)
    assert [x["size"] for x in e] == [2, 3], e
    assert e[1]["kind"] == "hosts_updated"
    assert first(events, "host_added", host="127.0.0.3")
    assert sum(1 for x in events if x["event"] == "worker_started") == 3
    assert out.count("done after") == 3
    # the new host's worker is appended: survivors keep ranks 0 and 1
    assert e[1]["assignment"][2]["host"] == "127.0.0.3"


def test_host_added_before_the_first_epoch_formed(job, tmp_path):
    """A host appears while the first epoch is still forming (its worker on 127.0.0.2 takes
    2 s to start). The worker already in epoch 1 would wait in its first collective for a
    peer that joins epoch 2 instead; so the new epoch is announced as an abort, not as the
    soft hosts-updated notice, and every worker meets in epoch 2 at once (before the fix:
    a hang until the collective timeout)."""
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1"])
    ev = tmp_path / "events"
    wrapper = per_host_wrapper(tmp_path, {"127.0.0.2": "sleep 2"})
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.2,
                   "--events", ev, wrapper, "--elastic", "--allreduce-seconds", 2])
    wait_for_event(job, ev, "worker_started", host="127.0.0.2")
    hosts.write_text("localhost:1\n127.0.0.2:1\n127.0.0.3:1\n")
    out, err = p.communicate(timeout=40)
    assert p.returncode == 0, err
    events = job.events(ev)
    e = epochs(events)
    assert [x["size"] for x in e] == [2, 3], e
    assert e[1]["kind"] == "abort", e
    assert "before epoch 1 had formed" in first(events, "reset")["reason"], events
    assert first(events, "epoch_joined", epoch=1) is None, events
    assert sum(1 for x in events if x["event"] == "worker_started") == 3  # nobody restarted
    assert out.count("done after") == 3


def test_host_removed_by_discovery_stops_its_workers(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1", "127.0.0.3:1"])
    ev = tmp_path / "events"
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.2,
                   "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 4])
    wait_for_workers(job, 3)
    hosts.write_text("localhost:1\n127.0.0.3:1\n")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    events = job.events(ev)
    e = epochs(events)
    assert [x["size"] for x in e] == [3, 2]
    assert e[1]["kind"] == "abort"
    assert [a["host"] for a in e[1]["assignment"]] == ["localhost", "127.0.0.3"]
    assert first(events, "worker_exited", host="127.0.0.2")["removed"] is True


@pytest.mark.parametrize("old_exit", ["prompt", "slow"])
def test_host_removed_and_listed_again_at_once_gets_a_new_worker(job, tmp_path, old_exit):
    """Discovery drops a host and lists it again 0.6 s later. The old and the new worker
    share host and slot; what concerns the old one (its exit report, its rendezvous
    connection closing, the SIGKILL that follows its SIGTERM after 2 s) must not reach the
    new one. Before the fix, that SIGKILL killed the new worker, whose lost connection
    then blacklisted the host ("prompt"), and an old worker slow to exit (its first
    incarnation ignores SIGTERM and lingers 1.5 s) had its exit taken for the new one's
    ("slow"). The new worker starts once the old one has exited."""
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.3:1"])
    ev = tmp_path / "events"
    prog = TESTPROG
    if old_exit == "slow":
        prog = per_host_wrapper(tmp_path, {"127.0.0.3": f'[ "$ELASTICRUN_EPOCH" = 1 ] && '
                                                        f'{{ trap "" TERM; {TESTPROG} "$@"; sleep 1.5; exit 0; }}'})
    p = job.start(["--min-np", 1, "--host-discovery-script", script, "--discovery-interval", 0.2,
                   "--events", ev, prog, "--elastic", "--allreduce-seconds", 8])
    wait_for_workers(job, 2)
    wait_for_event(job, ev, "epoch_joined", epoch=1)
    hosts.write_text("localhost:1\n")
    wait_for_event(job, ev, "host_removed", host="127.0.0.3")
    time.sleep(0.6)
    hosts.write_text("localhost:1\n127.0.0.3:1\n")
    out, err = p.communicate(timeout=60)
    events = job.events(ev)
    assert p.returncode == 0, err
    assert "blacklisting" not in err, err
    assert first(events, "host_blacklisted") is None, events
    old, new = [e for e in events if e["event"] == "worker_started" and e["host"] == "127.0.0.3"]
    old_exited = first(events, "worker_exited", pid=old["pid"])
    assert old_exited["removed"] is True, events
    assert new["t"] > old_exited["t"], events  # one process per slot at a time
    new_exited = first(events, "worker_exited", pid=new["pid"])
    assert (new_exited["code"], new_exited["signal"], new_exited["removed"]) == (0, 0, False), events
    last = epochs(events)[-1]
    assert [a["host"] for a in last["assignment"]] == ["localhost", "127.0.0.3"], last
    assert first(events, "epoch_joined", epoch=last["epoch"]), events
    assert out.count("done after") == 2


def test_flapping_discovery(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1"])
    ev = tmp_path / "events"
    p = job.start(["--min-np", 1, "--host-discovery-script", script, "--discovery-interval", 0.1,
                   "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 5])
    wait_for_workers(job, 2)
    for i in range(8):
        hosts.write_text("localhost:1\n127.0.0.2:1\n" + ("127.0.0.3:1\n" if i % 2 == 0 else ""))
        time.sleep(0.25)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert len(epochs(job.events(ev))) >= 4


def test_all_hosts_gone_and_back_within_elastic_timeout(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1"])
    ev = tmp_path / "events"
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.1,
                   "--elastic-timeout", 10, "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 3])
    wait_for_workers(job, 2)
    hosts.write_text("")
    time.sleep(1)
    hosts.write_text("localhost:1\n127.0.0.2:1\n")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    events = job.events(ev)
    assert first(events, "waiting_for_slots")
    assert len(epochs(events)) == 1  # the running epoch was never disturbed


def test_hosts_gone_past_elastic_timeout_fails(job, tmp_path):
    hosts, script = discovery(tmp_path, ["localhost:1", "127.0.0.2:1"])
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.1,
                   "--elastic-timeout", 1, TESTPROG, "--elastic", "--allreduce-seconds", 30])
    wait_for_workers(job, 2)
    hosts.write_text("localhost:1\n")
    t0 = time.monotonic()
    out, err = p.communicate(timeout=30)
    assert p.returncode == 4, err
    assert "fewer than 2 slots available for 1 s" in err
    assert time.monotonic() - t0 < 5


def test_not_enough_slots_at_start_times_out(job, tmp_path):
    _, script = discovery(tmp_path, ["localhost:1"])
    r = job.run(["--min-np", 2, "--host-discovery-script", script, "--elastic-timeout", 1, TESTPROG, "--elastic"])
    assert r.returncode == 4
    assert "fewer than 2 slots available" in r.stderr


@pytest.mark.parametrize("body,reason", [
    ("exit 3", "exited with code 3"),
    ("sleep 30", "timed out"),
    ("echo 'host:notanumber'", "line 1"),
])
def test_discovery_script_failing_later_keeps_last_good_set(job, tmp_path, body, reason):
    flag = tmp_path / "broken"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then {body}; fi\necho localhost:1\necho 127.0.0.2:1\n")
    script.chmod(0o755)
    ev = tmp_path / "events"
    p = job.start(["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.1,
                   "--discovery-timeout", 0.5, "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 3])
    wait_for_workers(job, 2)
    flag.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    errors = [e for e in job.events(ev) if e["event"] == "discovery_error"]
    assert errors and reason in errors[0]["message"], errors
    assert len(epochs(job.events(ev))) == 1


def test_discovery_script_failing_first_is_fatal(job, tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho boom >&2\nexit 2\n")
    script.chmod(0o755)
    r = job.run(["--min-np", 1, "--host-discovery-script", script, TESTPROG, "--elastic"])
    assert r.returncode == 3
    assert "host discovery failed on its first run" in r.stderr
    assert "boom" in r.stderr


def test_events_file_unwritable(job, tmp_path):
    r = job.run(["-np", 1, "--events", tmp_path / "no" / "such" / "dir", "true"])
    assert r.returncode == 3
    assert "cannot open --events file" in r.stderr
