"""Jobs across "hosts" that are network namespaces with a real OpenSSH sshd each
(scripts/testcluster): elasticrund is started over SSH with libssh, workers connect back to
the driver over the namespace network. Skipped where namespaces cannot be made."""
import time

import pytest

from conftest import EXAMPLES, ROOT, TESTPROG, our_processes, namespace_cluster
from test_sgd import finals, reference

CLUSTER = ROOT / "scripts" / "testcluster"


@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(3, 2)


HOSTS = ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
# The namespace "hosts" share one kernel, /dev/shm and the PID space but not the network,
# which real hosts never do; UCX's shared-memory and CMA transports would then connect
# some pairs across "hosts" and TCP others. Cross-host traffic goes over TCP, as it would
# between machines.
UCX_ACROSS_HOSTS = ["-x", "UCX_TLS=tcp,self"]


def run(job, cluster, args, timeout=120, extra=None):
    _, env = cluster
    return job.run(["-x", "ER_TEST_TAG", *UCX_ACROSS_HOSTS, *args], timeout=timeout, env={**env, **(extra or {})})


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
    directory, env = cluster
    args = ["--steps", 120, "--dim", 64, "--batch", 48, "--commit-every", 5]
    r = run(job, cluster, ["--min-np", 2, "--host-discovery-script", directory / "discover", "--max-np", 3,
                           EXAMPLES / "elastic_sgd", *args, "--step-ms", 5, "--fail-at-step", 40, "--fail-rank", 2,
                           "--fail-signal", 9])
    assert r.returncode == 0, r.stderr[-3000:]
    got = finals(r.stdout)
    assert len(got) >= 2 and all(g == reference(args) for g in got), got


def test_killing_the_driver_stops_every_remote_daemon_and_worker(job, cluster):
    _, env = cluster
    p = job.start(["-x", "ER_TEST_TAG", *UCX_ACROSS_HOSTS, "-np", 3, "-H", ",".join(h + ":1" for h in HOSTS), TESTPROG, "--init",
                   "--sleep", 120], env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = [pid for pid in our_processes(job.tag)
                   if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].endswith(b"/testprog")]
        if len(workers) == 3:
            break
        time.sleep(0.1)
    assert len(workers) == 3
    p.kill()
    p.wait(timeout=5)
    # The job fixture checks that every daemon and worker is gone within 5 s.
