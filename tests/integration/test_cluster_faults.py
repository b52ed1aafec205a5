"""Faults across namespace hosts (scripts/testcluster): a cut cable, a host whose sshd is
down, a remote daemon killed. Each runs examples/elastic_sgd in elastic mode over the
cluster's discovery script, checks the elastic invariant (every survivor's final model is
bit-identical to an uninterrupted single process's, with every commit counted once), and
bounds the time from the fault to training progressing again: the first commit that rank 0
reports in the new epoch, read live from the job's output.

What detects each fault:
- cut cable: the connections to that host fall silent. The daemon's heartbeats stop, and
  after --host-timeout (3 s in the test; 10 s by default) the driver gives the host up;
  TCP keep-alives on the driver's SSH connection and the worker's rendezvous connection
  (net::keep_alive() in common/socket_options.cc, with TCP_USER_TIMEOUT for
  unacknowledged data) are a backstop at 1.5 x the timeout (5 s here). UCX endpoints use
  UCP_ERR_HANDLING_MODE_NONE, so the survivors sit in their allreduce until the
  driver's abort (or their collective timeout, after which they re-join rather than
  exit). On the far side of the cut, the daemon hears no heartbeat from the driver for
  the same --host-timeout and stops its workers, even if the cable never comes back.
- sshd down: the connection is refused at once; the host is blacklisted at launch.
- daemon killed: sshd closes the channel at once; the workers die with their daemon
  (PR_SET_PDEATHSIG), so the survivors are told within milliseconds.

Skipped where network namespaces cannot be made. Besides the `job` fixture's check (the
workers carry the test's tag), every test checks that the hosts' namespaces hold nothing
but their sshd afterwards: remote daemons do not carry the tag."""
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, namespace_cluster
from test_elastic import epochs
from test_sgd import check_commits, finals, host_of, reference, sgd_workers
from test_ssh import CLUSTER, assert_hosts_hold_only_sshd, netns_pids, not_sshd

SGD = EXAMPLES / "elastic_sgd"
N = 3
# One slot per host: three workers on this machine's two cores.
ARGS = ["--steps", 200, "--dim", 64, "--batch", 48, "--commit-every", 5]

# Bounds on the time from the fault to rank 0's first commit in the new epoch.
HOST_TIMEOUT_S = 3
CUT_RECOVERY_S = 10.0  # --host-timeout (3 s, see above) + margin for a loaded machine
KILL_RECOVERY_S = 5.0  # a closed channel is seen at once; the rest is re-joining


def tc(*args, timeout=60):
    return subprocess.run([str(CLUSTER), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(N, 1)


class Watched:
    """A running job whose output lines are read as they come, with their arrival time."""

    def __init__(self, job, cluster, tmp_path, args):
        directory, env = cluster
        self.events_file = tmp_path / "events"
        self.p = job.start(["-x", "ER_TEST_TAG", "-x", "ELASTICRUN_COLLECTIVE_TIMEOUT",
                            "--min-np", 2, "--host-discovery-script", directory / "discover",
                            "--events", self.events_file, *args], env=env)
        self.job = job
        self.lines = []  # (monotonic time, "out" | "err", line)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, args=(f, name), daemon=True)
                        for f, name in ((self.p.stdout, "out"), (self.p.stderr, "err"))]
        for t in self.threads:
            t.start()

    def _read(self, f, name):
        for line in f:
            with self.lock:
                self.lines.append((time.monotonic(), name, line.rstrip("\n")))

    def wait_line(self, pattern, after=0.0, timeout=30):
        """Arrival time of the first output line matching `pattern` that came after `after`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for t, _, line in self.lines:
                    if t >= after and rx.search(line):
                        return t
            if self.p.poll() is not None and not any(t.is_alive() for t in self.threads):
                break
            time.sleep(0.01)
        raise AssertionError(f"no output line matching {pattern!r}; last lines:\n" + self.tail())

    def tail(self, n=40):
        with self.lock:
            return "\n".join(f"{t:.3f} {s} {l}" for t, s, l in self.lines[-n:])

    def events(self):
        return self.job.events(self.events_file)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # A test that failed half-way still ends its job (and the reader threads).
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for t in self.threads:
            t.join(timeout=5)

    def finish(self, timeout=90):
        try:
            self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
            for t in self.threads:
                t.join(timeout=5)
        with self.lock:
            out = "\n".join(l for _, s, l in self.lines if s == "out")
            err = "\n".join(l for _, s, l in self.lines if s == "err")
        return self.p.returncode, out, err


def first_commit_in_epoch(w, epoch, after):
    """When rank 0 reported its first commit in `epoch` (elastic_sgd's 'committed step N
    size S epoch E'), at or after `after`."""
    return w.wait_line(rf"^\[0\]<stdout>: committed step \d+ size \d+ epoch {epoch}$", after=after, timeout=60)


def check_invariant(code, out, err, survivors):
    """Every survivor ended with the reference model, and rank 0's commits never went back
    and reached the last step in epoch 2 (after the fault) or later."""
    assert code == 0, err[-4000:]
    got = finals(out)
    assert len(got) == survivors, out[-3000:]
    assert all(g == reference(ARGS) for g in got), got
    check_commits(out, ARGS[ARGS.index("--steps") + 1], min_epoch=2)


def blacklisted(events):
    return [e["host"] for e in events if e["event"] == "host_blacklisted"]


def test_cut_link_host_is_dropped_and_the_job_goes_on(job, cluster, tmp_path):
    """Host 2's cable is cut mid-training (packets dropped, no error anywhere): after
    --host-timeout without its daemon's heartbeats the driver declares it lost,
    blacklists the host, and the two others go on from their last commit; the cable
    comes back while they train."""
    directory, _ = cluster
    with Watched(job, cluster, tmp_path, ["--host-timeout", HOST_TIMEOUT_S, SGD, *ARGS, "--step-ms", 10]) as w:
        try:
            w.wait_line(r"^\[0\]<stdout>: committed step 40 size 3 epoch 1$")
            r = tc("link", 2, "down")
            cut = time.monotonic()
            assert r.returncode == 0, r.stderr
            # Back up as soon as the host has been dropped: the job must then neither take
            # the host back (it is blacklisted) nor be disturbed by its stale workers.
            deadline = cut + CUT_RECOVERY_S + 10
            while not blacklisted(w.events()) and time.monotonic() < deadline and w.p.poll() is None:
                time.sleep(0.05)
            detected = time.monotonic() - cut
            # The cable stays cut: behind it, the daemon hears no heartbeat for the
            # host timeout and stops its workers, and the worker's own keep-alive has
            # expired too. (sshd's session process lingers until its own TCP
            # connection times out.)
            while time.monotonic() < cut + 20 and not_sshd(netns_pids(2)):
                time.sleep(0.1)
            cleared = time.monotonic() - cut
        finally:
            r = tc("link", 2, "up")
            assert r.returncode == 0, r.stderr
        assert blacklisted(w.events()) == ["10.77.0.12"], w.tail()
        resumed = first_commit_in_epoch(w, 2, after=cut) - cut
        code, out, err = w.finish()
    print(f"cut link: host dropped after {detected:.2f} s, training resumed after {resumed:.2f} s, "
          f"the cut host cleared itself after {cleared:.2f} s")
    check_invariant(code, out, err, survivors=2)
    # The missing heartbeats report the cut, before any keep-alive expires.
    assert re.search(r"host '10\.77\.0\.12' lost its daemon: heard nothing from it for \d+\.\d s "
                     r"\(--host-timeout\)", err), err[-3000:]
    sizes = [e["size"] for e in epochs(w.events())]
    assert sizes == [3, 2], sizes
    assert HOST_TIMEOUT_S - 1 < detected, f"host dropped {detected:.1f} s after the cut, before --host-timeout"
    assert resumed < CUT_RECOVERY_S, f"training resumed {resumed:.1f} s after the cut"
    assert cleared < 15, f"the cut host's daemon and worker outlived the cut by {cleared:.1f} s"
    assert_hosts_hold_only_sshd(directory, N, timeout=15)


def test_host_with_sshd_down_is_blacklisted_at_launch(job, cluster, tmp_path):
    """Host 2 refuses ssh (its sshd stopped): that host is blacklisted, and the job runs on
    the other two from the start."""
    directory, _ = cluster
    r = tc("sshd", 2, "stop")
    assert r.returncode == 0, r.stderr
    try:
        started = time.monotonic()
        with Watched(job, cluster, tmp_path, [SGD, *ARGS, "--step-ms", 5]) as w:
            first = first_commit_in_epoch(w, 2, after=started) - started
            code, out, err = w.finish()
    finally:
        r = tc("sshd", 2, "start")
        assert r.returncode == 0, r.stderr
    print(f"sshd down: first commit {first:.2f} s after the launch")
    check_invariant(code, out, err, survivors=2)
    assert re.search(r"host '10\.77\.0\.12' could not start its daemon: ssh: cannot connect", err), err[-3000:]
    events = w.events()
    assert blacklisted(events) == ["10.77.0.12"], events
    assert not [e for e in events if e["event"] == "worker_started" and e["host"] == "10.77.0.12"]
    sizes = [e["size"] for e in epochs(events)]
    assert sizes == [3, 2], sizes
    assert first < 10.0
    assert_hosts_hold_only_sshd(directory, N)


def test_remote_daemon_killed_its_host_is_dropped(job, cluster, tmp_path):
    """SIGKILL to the elasticrund of host 2 mid-training: its worker dies with it, the host
    is blacklisted, and the others go on within seconds."""
    directory, _ = cluster
    with Watched(job, cluster, tmp_path, [SGD, *ARGS, "--step-ms", 10]) as w:
        workers = {host_of(p): p for p in sgd_workers(job, N)}
        worker = workers["10.77.0.12"]
        daemon = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert Path(f"/proc/{daemon}/cmdline").read_bytes().split(b"\0")[0].endswith(b"elasticrund")
        assert daemon in netns_pids(2)
        w.wait_line(r"^\[0\]<stdout>: committed step 40 size 3 epoch 1$")
        # Its worker's shared-memory directory, which the next daemon on the host must remove.
        assert [e for e in os.listdir("/dev/shm") if e.startswith(f"elasticrun.{daemon}.")], \
            sorted(os.listdir("/dev/shm"))[:20]
        os.kill(daemon, signal.SIGKILL)
        killed = time.monotonic()
        resumed = first_commit_in_epoch(w, 2, after=killed) - killed
        code, out, err = w.finish()
    print(f"daemon killed: training resumed after {resumed:.2f} s")
    check_invariant(code, out, err, survivors=2)
    events = w.events()
    assert blacklisted(events) == ["10.77.0.12"], events
    sizes = [e["size"] for e in epochs(events)]
    assert sizes == [3, 2], sizes
    assert resumed < KILL_RECOVERY_S, f"training resumed {resumed:.1f} s after the kill"
    assert_hosts_hold_only_sshd(directory, N)
    # A SIGKILLed daemon cannot remove its workers' shared-memory directories; the next
    # daemon started on that host does (common/shm_dirs.h). Start one, as a later job would.
    r = job.run(["-x", "ER_TEST_TAG", "-np", 1, "-H", "10.77.0.12:1", SGD, "--steps", 5],
                env=cluster[1], timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    stale = [e for e in os.listdir("/dev/shm") if e.startswith(f"elasticrun.{daemon}.")]
    assert not stale, stale
