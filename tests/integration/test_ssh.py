"""Jobs across "hosts" that are network namespaces with a real OpenSSH sshd each
(scripts/testcluster): elasticrund is started over SSH with libssh, workers connect back to
the driver over the namespace network. Skipped where namespaces cannot be made.

Remote daemons are started by sshd, not by the test, and carry no test tag (ssh passes no
environment): the `job` fixture cannot see them, so tests that must leave nothing behind
check the hosts' namespaces too (assert_hosts_hold_only_sshd)."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, TESTPROG, our_processes, namespace_cluster
from test_sgd import check_commits, finals, reference

CLUSTER = ROOT / "scripts" / "testcluster"


@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(3, 2)


HOSTS = ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
# The namespace "hosts" share one kernel, the IPC namespace, /dev/shm and the PID space but
# not the network, as containers with Docker's --ipc=host do. Jobs run with UCX's default
# settings: the library keeps UCX off shared memory between network namespaces
# (collective/src/host/ucx_address.h), so cross-host traffic goes over TCP.


def netns_pids(k):
    """Pids of the processes in host k's namespace (er-hk)."""
    r = subprocess.run(["ip", "netns", "pids", f"er-h{k}"], capture_output=True, text=True, timeout=10)
    return {int(p) for p in r.stdout.split()}


def sshd_pid(directory, k):
    try:
        return int((directory / f"h{k}" / "sshd.pid").read_text())
    except (OSError, ValueError):
        return None


def argv0(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def not_sshd(pids):
    """The processes among `pids` that are not sshd's (daemons, workers)."""
    out = set()
    for p in pids:
        try:
            if not Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sshd"):
                out.add(p)
        except OSError:
            pass
    return out


def assert_hosts_hold_only_sshd(directory, hosts, timeout=10):
    """Every host's namespace (hosts 1..`hosts`) is back to its sshd listener alone: no
    daemon, worker or ssh session outlived the job (waits up to `timeout`, then kills them
    and fails)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {k: netns_pids(k) - {sshd_pid(directory, k)} for k in range(1, hosts + 1)}
        left = {k: pids for k, pids in left.items() if pids}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    described = {}
    for k, pids in left.items():
        for p in pids:
            try:
                described[p] = (k, Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    assert not left, f"processes left on the hosts (host, command line): {described}"


def run(job, cluster, args, timeout=120, extra=None):
    _, env = cluster
    return job.run(["-x", "ER_TEST_TAG", *args], timeout=timeout, env={**env, **(extra or {})})


def test_topology_across_hosts_with_uneven_slots(job, cluster):
    r = run(job, cluster, ["-np", 6, "-H", "10.77.0.11:3,10.77.0.12:1,10.77.0.13:2", TESTPROG, "--topology"])
    assert r.returncode == 0, r.stderr
    want = [
        "rank 0 size 6 local_rank 0 local_size 3 cross_rank 0 cross_size 3 host 10.77.0.11",
        "rank 2 size 6 local_rank 2 local_size 3 cross_rank 0 cross_size 1 host 10.77.0.11",
        "rank 3 size 6 local_rank 0 local_size 1 cross_rank 1 cross_size 3 host 10.77.0.12",
        "rank 5 size 6 local_rank 1 local_size 2 cross_rank 1 cross_size 2 host 10.77.0.13",
    ]
    for w in want:
        assert w in r.stdout, r.stdout


@pytest.mark.parametrize("progress", ["busy", "block"])
def test_uneven_world_over_hosts_sharing_ipc_with_ucx_defaults(job, cluster, progress):
    """Six ranks, two per host: recursive doubling over a world that is not a power of two
    starts with receives from another host. UCX would pair the hosts over shared memory
    (one boot_id, one IPC namespace) and its wake-up of an idle receiver cannot cross
    network namespaces: every such job used to hang in its first allreduce. The timeout
    makes a regression fail with the library's error naming the peer, not hang."""
    r = run(job, cluster, ["-x", "ELASTICRUN_COLLECTIVE_TIMEOUT=30", "-x", f"ELASTICRUN_PROGRESS={progress}",
                           "-np", 6, "-H", ",".join(h + ":2" for h in HOSTS), TESTPROG, "--allreduce-seconds", 1],
            timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert len(re.findall(r"rank \d done after \d+ allreduces", r.stdout)) == 6, r.stdout


def test_allreduce_check_across_three_hosts(job, cluster):
    r = run(job, cluster, ["-np", 3, "-H", ",".join(h + ":1" for h in HOSTS), EXAMPLES / "allreduce_check"],
            timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("allreduce_check: OK") == 3


def test_host_key_mismatch_is_refused(job, cluster, tmp_path):
    directory, env = cluster
    # Give every host the key of another: a changed key must never be accepted.
    lines = (directory / "known_hosts").read_text().splitlines()
    keys = [l.split(None, 1)[1] for l in lines if l.strip() and not l.startswith("#")]
    names = [l.split(None, 1)[0] for l in lines if l.strip() and not l.startswith("#")]
    bad = tmp_path / "known_hosts"
    bad.write_text("".join(f"{n} {keys[(i + 1) % len(keys)]}\n" for i, n in enumerate(names)))
    r = run(job, cluster, ["-np", 1, "-H", "10.77.0.11:1", TESTPROG, "--topology"],
            extra={"ELASTICRUN_SSH_KNOWN_HOSTS": str(bad), "ELASTICRUN_SSH_CONFIG": "/dev/null"})
    assert r.returncode == 3, r.stderr
    assert "HOST KEY MISMATCH" in r.stderr


def test_unknown_host_key_refused_unless_accept_new(job, cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    extra = {"ELASTICRUN_SSH_KNOWN_HOSTS": str(empty), "ELASTICRUN_SSH_CONFIG": "/dev/null"}
    r = run(job, cluster, ["-np", 1, "-H", "10.77.0.12:1", TESTPROG, "--topology"], extra=extra)
    assert r.returncode == 3 and "host key unknown" in r.stderr, r.stderr
    r = run(job, cluster, ["-np", 1, "-H", "10.77.0.12:1", "--ssh-host-key-checking", "accept-new", TESTPROG,
                           "--topology"], extra=extra)
    assert r.returncode == 0, r.stderr
    assert "10.77.0.12" in empty.read_text()


def test_remote_worker_killed_keeps_the_invariant(job, cluster):
    """Rank 2 SIGKILLs itself at step 42, between commits (every 5): its host is
    blacklisted, and the job goes on in epoch 2 from the commit of step 40, with 3 workers
    again (the other two hosts have four slots)."""
    directory, env = cluster
    args = ["--steps", 120, "--dim", 64, "--batch", 48, "--commit-every", 5]
    r = run(job, cluster, ["--min-np", 2, "--host-discovery-script", directory / "discover", "--max-np", 3,
                           EXAMPLES / "elastic_sgd", *args, "--step-ms", 5, "--fail-at-step", 42, "--fail-rank", 2,
                           "--fail-signal", 9])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "elastic_sgd: injected failure at step 42 on rank 2" in r.stderr, r.stderr[-3000:]
    got = finals(r.stdout)
    # Its host is blacklisted; the other two hosts' four slots give --max-np 3 workers again.
    assert len(got) == 3 and all(g == reference(args) for g in got), got
    assert check_commits(r.stdout, 120, min_epoch=2)[-1][1] == 3, r.stdout[-3000:]


def test_killing_the_driver_stops_every_remote_daemon_and_worker(job, cluster):
    _, env = cluster
    p = job.start(["-x", "ER_TEST_TAG", "-np", 3, "-H", ",".join(h + ":1" for h in HOSTS), TESTPROG, "--init",
                   "--sleep", 120], env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = [pid for pid in our_processes(job.tag)
                   if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].endswith(b"/testprog")]
        if len(workers) == 3:
            break
        time.sleep(0.1)
    assert len(workers) == 3
    # The remote daemons carry no test tag: find them in the hosts' namespaces.
    daemons = {k: [pid for pid in not_sshd(netns_pids(k)) if argv0(pid).endswith(b"elasticrund")]
               for k in range(1, len(HOSTS) + 1)}
    assert all(len(d) == 1 for d in daemons.values()), daemons
    p.kill()
    p.wait(timeout=5)
    # The job fixture checks that every worker is gone within 5 s; the daemons, and
    # anything else on the hosts but their sshd, must be gone too.
    directory, _ = cluster
    assert_hosts_hold_only_sshd(directory, len(HOSTS))
