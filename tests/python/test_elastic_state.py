"""elasticrun.elastic (ObjectState, @run) under real faults: a worker that exits at a
step between commits, SIGKILL of rank 0, a SIGSTOPped worker, hosts added and removed by
discovery. Each run must end with exactly the single-process reference's model on every
rank (integer training: any split gives the same bits), with rank 0's commits never going
back (check_commits) and the resets the test caused seen."""
import os
import signal
import subprocess
import threading
import time

from conftest import HERE, PYTHON, check_commits, discovery_script, run_python, start_python, workers_of

WORKER = HERE / "workers" / "elastic_numpy.py"
HOSTS3 = ["-H", "localhost:1,127.0.0.2:1,127.0.0.3:1"]


def reference(steps):
    r = subprocess.run([PYTHON, str(WORKER), str(steps), "--reference"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def check(out, err, code, n_final, steps, min_epoch):
    assert code == 0, err[-3000:]
    finals = [l.split(": ", 1)[1] for l in out.splitlines() if "]<stdout>: final " in l]
    assert len(finals) == n_final, out[-3000:]
    want = reference(steps)
    assert all(f == want for f in finals), (finals, want)
    check_commits(out, steps, min_epoch)


def test_failure_between_commits_is_rolled_back(job):
    """Rank 1 exits at step 12 (commits at 10, 15): the survivors roll back steps 11-12
    (begun counts them) and re-join without it."""
    r = run_python(job, [*HOSTS3, "--min-np", 2], WORKER, 60, "--fail-at", 12)
    assert "injected failure at step 12" in r.stderr, r.stderr[-2000:]
    check(r.stdout, r.stderr, r.returncode, 2, 60, min_epoch=2)
    assert r.stdout.count("reset: size 2") == 2, r.stdout[-2000:]


def test_sigkill_of_rank0(job):
    p = start_python(job, [*HOSTS3, "--min-np", 2], WORKER, 150, "--step-ms", 20)
    by_host = workers_of(job, "elastic_numpy.py", 3)
    time.sleep(1.0)
    os.kill(by_host["localhost"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 2, 150, min_epoch=2)


def test_sigstopped_worker_with_another_killed(job):
    """One worker stops (SIGSTOP) while another dies: the new epoch fails the stopped one
    after --rendezvous-timeout, and the last survivor goes on alone."""
    p = start_python(job, [*HOSTS3, "--min-np", 1, "--rendezvous-timeout", 1], WORKER, 150, "--step-ms", 20)
    by_host = workers_of(job, "elastic_numpy.py", 3)
    time.sleep(1.0)
    os.kill(by_host["127.0.0.2"], signal.SIGSTOP)
    os.kill(by_host["127.0.0.3"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 1, 150, min_epoch=2)


def test_sigstopped_worker_is_failed_after_the_worker_timeout(job, tmp_path):
    """The library's heartbeat thread serves a Python worker too: a stopped one is failed
    2 s (--worker-timeout) after its last beat, long before the collective timeout (60 s
    here) or a --rendezvous-timeout would notice, and the survivors finish."""
    ev = tmp_path / "events"
    p = start_python(job, [*HOSTS3, "--min-np", 2, "--worker-timeout", 2, "--events", ev], WORKER, 150,
                     "--step-ms", 20)
    by_host = workers_of(job, "elastic_numpy.py", 3)
    time.sleep(1.0)
    os.kill(by_host["127.0.0.2"], signal.SIGSTOP)
    stopped = time.monotonic()
    out, err = p.communicate(timeout=120)
    check(out, err, p.returncode, 2, 150, min_epoch=2)
    assert time.monotonic() - stopped < 20, "the job waited for another timeout"
    blacklisted = [e for e in job.events(ev) if e["event"] == "host_blacklisted"]
    assert [(e["host"], e["cause"]) for e in blacklisted] == [("127.0.0.2", "worker_timeout")], blacklisted


def test_worker_computing_in_python_for_longer_than_the_worker_timeout_is_not_failed(job):
    """Rank 1 computes in pure Python for 3 s at step 7, holding the GIL, with a worker
    timeout of 1 s: the heartbeat thread needs no GIL, so nobody is failed."""
    r = run_python(job, [*HOSTS3, "--min-np", 2, "--worker-timeout", 1], WORKER, 30, "--busy-at", 7,
                   "--busy-seconds", 3)
    assert "busy for 3.0 s at step 7" in r.stdout, r.stdout[-2000:]
    assert "blacklisting" not in r.stderr, r.stderr[-2000:]
    check(r.stdout, r.stderr, r.returncode, 3, 30, min_epoch=1)
    assert "reset:" not in r.stdout


def test_hosts_added_then_removed(job, tmp_path):
    """Growing from 2 to 4 (the new workers must receive the state, not hang in sync:
    horovod#2652), then shrinking to 3 by removal alone (every rank syncs, so none waits
    for a rank that skipped it: horovod#3494)."""
    hosts, script = discovery_script(tmp_path, ["localhost:1", "127.0.0.2:1"])
    p = start_python(job, ["--min-np", 2, "--host-discovery-script", script, "--discovery-interval", 0.1],
                     WORKER, 200, "--step-ms", 20)
    workers_of(job, "elastic_numpy.py", 2)
    time.sleep(0.8)
    hosts.write_text("localhost:1\n127.0.0.2:1\n127.0.0.3:2\n")
    # Shrinks once rank 0 has committed at size 4 (a fixed wait was once too short). Both
    # pipes are drained meanwhile, so that neither can fill and stop the driver.
    out_lines, err_lines = [], []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
               for f, into in ((p.stdout, out_lines), (p.stderr, err_lines))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 60
    while not any("committed step" in l and " size 4 " in l for l in list(out_lines)):
        assert time.monotonic() < deadline and p.poll() is None, "".join(out_lines)[-3000:] + "".join(err_lines)[-3000:]
        time.sleep(0.05)
    hosts.write_text("localhost:1\n127.0.0.3:2\n")
    p.wait(timeout=120)
    for t in readers:
        t.join(timeout=10)
    out, err = "".join(out_lines), "".join(err_lines)
    check(out, err, p.returncode, 3, 200, min_epoch=3)
    sizes = [int(l.split("size ")[1].split()[0]) for l in out.splitlines() if "committed step" in l]
    assert sizes[0] == 2 and 4 in sizes and sizes[-1] == 3, sizes
