"""torch.distributed programs written for torchrun, under elasticrun unchanged: torchrun's
environment for every worker, restart mode (--max-restarts), and the root cause from a
failed worker's error file. The DDP script is examples/python/ddp_torchrun.py (gloo,
env://), run by Debian's /usr/bin/python3, which has torch; tests that need torch skip
without it."""
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, our_processes, discovery_script, namespace_cluster

PYTHON = "/usr/bin/python3"
DDP = ROOT / "examples" / "python" / "ddp_torchrun.py"
HOSTS = "127.0.0.1:2,127.0.0.2:1"  # uneven: two workers on one host, one on another


def has_torch():
    r = subprocess.run([PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                       capture_output=True, timeout=60)
    return r.returncode == 0


needs_torch = pytest.mark.skipif(not has_torch(), reason=f"{PYTHON} has no torch with gloo")


def ddp(tmp_path, *args, name="ck.pt"):
    return [PYTHON, DDP, "--checkpoint", tmp_path / name, *map(str, args)]


def lines(out, what):
    """The 'ddp: <what> ...' lines of the merged output, without the rank prefix."""
    return [l.split("ddp: ", 1)[1] for l in out.splitlines() if f"ddp: {what}" in l]


def starts(out):
    """Each worker's start line as a dict."""
    found = []
    for l in lines(out, "rank "):
        m = re.match(r"rank (\d+) local_rank (\d+) world (\d+) pg_rank (\d+) pg_world (\d+) group (\d+)/(\d+) "
                     r"restart (\d+) port (\d+) pid (\d+)", l)
        assert m, l
        keys = ["rank", "local_rank", "world", "pg_rank", "pg_world", "group", "groups", "restart", "port", "pid"]
        found.append(dict(zip(keys, map(int, m.groups()))))
    return found


def final(out):
    """(sum, sum of squares, largest difference between ranks) of the parameters."""
    done = lines(out, "done")
    assert len(done) == 1, out[-3000:]
    m = re.match(r"done steps \d+ params (\S+) (\S+) max_diff (\S+)", done[0])
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


class Streamed:
    """A running elasticrun whose stdout is read as it comes."""

    def __init__(self, proc):
        self.proc, self.out, self.err = proc, [], []
        self.threads = [threading.Thread(target=self._read, args=(proc.stdout, self.out), daemon=True),
                        threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True)]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(f, into):
        for line in f:
            into.append(line)

    def wait_for(self, pattern, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, l) for l in list(self.out)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the output:\n{''.join(self.out)[-3000:]}{''.join(self.err)[-3000:]}")

    def finish(self, timeout=180):
        self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=10)
        return self.proc.returncode, "".join(self.out), "".join(self.err)


def worker_of_rank(job, rank):
    """The pid of the job's DDP worker whose RANK is `rank`."""
    for pid in our_processes(job.tag):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"ddp_torchrun.py" in cmdline and f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no worker of rank {rank}")


def events(job, path, name):
    return [e for e in job.events(path) if e["event"] == name]


# ---- the environment (no torch needed) ----

ENV_NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
             "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
             "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME"]


def worker_envs(stdout):
    """Each worker's printed variables (one 'env {json}' line a worker), by RANK."""
    out = {}
    for l in stdout.splitlines():
        if "env {" in l:
            e = json.loads(l.split("env ", 1)[1])
            out[int(e["RANK"])] = e
    return out


def print_env_command():
    names = json.dumps(ENV_NAMES)
    return [PYTHON, "-c", f"import json, os; print('env', json.dumps({{k: os.environ.get(k) for k in {names}}}))"]


def test_every_worker_gets_torchruns_environment(job, tmp_path):
    ev = tmp_path / "events"
    r = job.run(["-np", 3, "-H", HOSTS, "--run-id", "exp-42", "--events", ev, *print_env_command()])
    assert r.returncode == 0, r.stderr
    env = worker_envs(r.stdout)
    assert sorted(env) == [0, 1, 2], r.stdout
    cores = len(os.sched_getaffinity(0))
    expect = {0: ("0", "2", "0", "127.0.0.1"), 1: ("1", "2", "0", "127.0.0.1"), 2: ("0", "1", "1", "127.0.0.2")}
    cross = {0: ("0", "2"), 1: ("0", "1"), 2: ("1", "2")}  # Horovod's: among the workers of one local rank
    ports = events(job, ev, "port_reserved")
    assert len(ports) == 1 and ports[0]["host"] == "127.0.0.1", ports
    for rank, (local_rank, local_size, group, host) in expect.items():
        e = env[rank]
        assert (e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == (local_rank, local_size, group), e
        assert e["WORLD_SIZE"] == "3" and e["GROUP_WORLD_SIZE"] == "2", e
        assert (e["ROLE_RANK"], e["ROLE_WORLD_SIZE"], e["ROLE_NAME"]) == (str(rank), "3", "default"), e
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == str(ports[0]["port"]), e
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0"), e
        assert e["TORCHELASTIC_RUN_ID"] == "exp-42", e
        assert (e["HOROVOD_RANK"], e["HOROVOD_SIZE"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"],
                e["HOROVOD_HOSTNAME"]) == (str(rank), "3", local_rank, local_size, host), e
        assert (e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) == cross[rank], e
        assert e["OMP_NUM_THREADS"] == str(max(1, cores // int(local_size))), e
        assert re.fullmatch(r"/dev/shm/elasticrun\.\d+\.\d+\.errors/\d+\.\d+\.json", e["TORCHELASTIC_ERROR_FILE"]), e
    assert len({e["TORCHELASTIC_ERROR_FILE"] for e in env.values()}) == 3
    if cores // 2 < cores:
        assert "OMP_NUM_THREADS is not set" in r.stderr
    # the job fixture checks that the daemons removed the error files' directories


def test_dash_x_wins_over_every_default(job):
    r = job.run(["-np", 2, "-x", "OMP_NUM_THREADS=3", "-x", "MASTER_ADDR=elsewhere", "-x", "ROLE_NAME=trainer",
                 "-x", "TORCHELASTIC_ERROR_FILE=/nonexistent/e.json", *print_env_command()])
    assert r.returncode == 0, r.stderr
    for e in worker_envs(r.stdout).values():
        assert (e["OMP_NUM_THREADS"], e["MASTER_ADDR"], e["ROLE_NAME"]) == ("3", "elsewhere", "trainer"), e
        assert e["TORCHELASTIC_ERROR_FILE"] == "/nonexistent/e.json"
    assert "OMP_NUM_THREADS is not set" not in r.stderr


def test_the_master_port_is_held_until_rank_0_listens(job):
    """Rank 0's daemon keeps MASTER_PORT bound (not listening) for the epoch: a plain bind
    to it fails, a listener with SO_REUSEADDR (as torch's TCPStore) succeeds."""
    probe = ("import os, socket\n"
             "port = int(os.environ['MASTER_PORT'])\n"
             "s = socket.socket()\n"
             "try:\n    s.bind(('0.0.0.0', port)); print('plain bind succeeded')\n"
             "except OSError as e:\n    print('plain bind refused', e.errno)\n"
             "t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             "t.bind(('0.0.0.0', port)); t.listen(); print('listening')\n")
    r = job.run(["-np", 1, PYTHON, "-c", probe])
    assert r.returncode == 0, r.stderr
    assert "plain bind refused 98" in r.stdout and "listening" in r.stdout, r.stdout


# ---- error files ----

@needs_torch
def test_a_failed_workers_error_file_is_reported_with_its_traceback(job, tmp_path):
    script = ("from torch.distributed.elastic.multiprocessing.errors import record\n"
              "import os\n"
              "@record\n"
              "def main():\n"
              "    if os.environ['RANK'] == '1':\n"
              "        raise ValueError('learning rate 7 is too high')\n"
              "main()\n")
    ev = tmp_path / "events"
    r = job.run(["-np", 2, "-H", HOSTS, "--events", ev, PYTHON, "-c", script])
    assert r.returncode == 1, r.stderr
    assert "rank 1 (host '127.0.0.1', slot 1, pid" in r.stderr
    cause = r.stderr.split("root cause (first observed failure):", 1)[1]
    assert re.search(r"  time      : \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n  host      : 127\.0\.0\.1\n"
                     r"  rank      : 1 \(local_rank: 1\)\n  exitcode  : 1 \(pid: \d+\)\n"
                     r"  message   : ValueError: learning rate 7 is too high\n"
                     r"  traceback : Traceback \(most recent call last\):\n", cause), cause
    assert "              ValueError: learning rate 7 is too high" in cause, cause
    (e,) = events(job, ev, "worker_error")
    assert e["rank"] == 1 and e["message"] == "ValueError: learning rate 7 is too high", e
    assert 'File "<string>", line 6, in main' in e["traceback"], e


@pytest.mark.parametrize("content, expect", [
    ("printf 'Segmentation \\033[31m fault \\377' > $TORCHELASTIC_ERROR_FILE",
     "error_file: unreadable: not JSON: Segmentation ?[31m fault ?"),
    ("head -c 70000 /dev/zero | tr '\\0' x > $TORCHELASTIC_ERROR_FILE",
     "error_file: unreadable: the file holds 70000 bytes, over the 65536-byte limit"),
    ("mkfifo $TORCHELASTIC_ERROR_FILE", None),
    ("ln -s /etc/passwd $TORCHELASTIC_ERROR_FILE", None),
])
def test_whatever_a_worker_leaves_as_its_error_file_is_never_trusted(job, tmp_path, content, expect):
    """Junk, a file over the limit, a FIFO (whose read would wait for a writer) or a link:
    the job still ends with the worker's own failure, and nothing is left in /dev/shm."""
    r = job.run(["-np", 1, "sh", "-c", f"{content}; exit 3"], timeout=30)
    assert r.returncode == 1, r.stderr
    assert "rank 0 (host 'localhost', slot 0, pid" in r.stderr and "exited with code 3" in r.stderr, r.stderr
    if expect:
        assert expect in r.stderr, r.stderr
    else:
        assert "root cause" not in r.stderr, r.stderr


# ---- unmodified DDP ----

@needs_torch
def test_unmodified_ddp_script_across_loopback_hosts_with_uneven_slots(job, tmp_path):
    r = job.run(["-np", 3, "-H", HOSTS, *ddp(tmp_path, "--steps", 20)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = sorted(starts(r.stdout), key=lambda s: s["rank"])
    assert [(s["rank"], s["local_rank"], s["group"]) for s in got] == [(0, 0, 0), (1, 1, 0), (2, 0, 1)], got
    for s in got:
        assert s["pg_rank"] == s["rank"] and s["pg_world"] == s["world"] == 3 and s["groups"] == 2, s
    assert final(r.stdout)[2] == 0.0  # every rank holds the same parameters


@needs_torch
def test_sigkilled_worker_restarts_every_worker_from_the_checkpoint(job, tmp_path):
    """Rank 1 is SIGKILLed mid-training: every worker stops and a new generation starts
    (new processes, new port, TORCHELASTIC_RESTART_COUNT 1), resumes from rank 0's
    checkpoint, and ends with the parameters of a run without the fault."""
    steps = ["--steps", 30, "--step-ms", 60]
    ref = job.run(["-np", 3, "-H", HOSTS, *ddp(tmp_path, *steps, name="ref.pt")], timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ev = tmp_path / "events"
    run = Streamed(job.start(["-np", 3, "-H", HOSTS, "--max-restarts", 2, "--events", ev,
                              *ddp(tmp_path, *steps, "--print-steps")]))
    run.wait_for(r"ddp: step 8 rank 1 ")
    os.kill(worker_of_rank(job, 1), signal.SIGKILL)
    rc, out, err = run.finish()
    assert rc == 0, err[-3000:]
    assert re.search(r"rank 1 \(host '127\.0\.0\.1', slot 1, pid \d+\) was killed by signal 9 \(SIGKILL\); "
                     r"restarting every worker \(restart 1 of 2\)", err), err
    first, second = [[s for s in starts(out) if s["restart"] == k] for k in (0, 1)]
    assert len(first) == 3 and len(second) == 3, out
    assert not {s["pid"] for s in first} & {s["pid"] for s in second}
    assert len({s["port"] for s in first}) == 1 and len({s["port"] for s in second}) == 1
    assert first[0]["port"] != second[0]["port"]
    resumed = lines(out, "resumed at step")
    assert len(resumed) == 3 and int(resumed[0].split()[-1]) >= 7, out
    # Within float32 rounding (a fresh DDP reduces in another bucket order than the one it
    # settles into); a step lost or done twice would move them by far more.
    assert final(out) == pytest.approx(final(ref.stdout), rel=1e-6, abs=1e-6)
    (restart,) = events(job, ev, "restart")
    assert restart["cause"] == "failure" and restart["restart_count"] == 1 and restart["generation"] == 2
    assert [e["port"] for e in events(job, ev, "port_reserved")] == [first[0]["port"], second[0]["port"]]


@needs_torch
def test_exhausted_restarts_fail_the_job_naming_the_cause(job, tmp_path):
    """Rank 1 raises at step 3 in every generation: two restarts, then the third failure
    ends the job (exit 1) naming it, with its error file's exception."""
    r = job.run(["-np", 2, "-H", "127.0.0.1:1,127.0.0.2:1", "--max-restarts", 2,
                 *ddp(tmp_path, "--steps", 10, "--raise-at-step", 3, "--fail-always")], timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "restarting every worker (restart 2 of 2)" in r.stderr
    assert re.search(r"rank 1 \(host '127\.0\.0\.2', slot 0, pid \d+\) exited with code 1; no restart left "
                     r"\(--max-restarts 2\)", r.stderr), r.stderr[-3000:]
    assert r.stderr.count("message   : RuntimeError: injected failure at step 3 on rank 1") == 3, r.stderr[-3000:]
    assert sorted({s["restart"] for s in starts(r.stdout)}) == [0, 1, 2]


@needs_torch
def test_a_host_added_by_discovery_joins_at_a_restart_that_is_not_counted(job, tmp_path):
    hosts, script = discovery_script(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"])
    ev = tmp_path / "events"
    run = Streamed(job.start(["--min-np", 2, "--max-np", 3, "--host-discovery-script", script, "--max-restarts", 0,
                              "--events", ev, *ddp(tmp_path, "--steps", 30, "--step-ms", 60, "--print-steps")]))
    run.wait_for(r"ddp: step 5 rank 0 ")
    hosts.write_text("127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n")
    rc, out, err = run.finish()
    assert rc == 0, err[-3000:]
    assert "hosts changed; restarting every worker (not counted against --max-restarts)" in err
    later = [s for s in starts(out) if s["world"] == 3]
    assert len(later) == 3 and all(s["restart"] == 0 for s in later), out
    assert lines(out, "resumed at step")
    assert final(out)[2] == 0.0
    (restart,) = events(job, ev, "restart")
    assert restart["cause"] == "hosts_changed" and restart["restart_count"] == 0


# ---- bad input ----

@pytest.mark.parametrize("args, message", [
    (["--max-restarts", "-1"], "--max-restarts '-1': expected a number of restarts, 0 to 1000000"),
    (["--max-restarts", "many"], "--max-restarts 'many': expected a number of restarts"),
    (["--max-restarts", "1", "--reset-limit", "2"], "give --max-restarts (restart mode) or --reset-limit"),
    (["--run-id", "a/b"], "--run-id 'a/b': expected 1 to 128 letters"),
])
def test_bad_restart_flags_are_usage_errors(job, args, message):
    r = job.run([*args, "-np", 1, "true"])
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr


# ---- over SSH, on the namespace cluster ----

@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(2, 2)


def test_master_addr_of_a_local_rank_0_is_our_address_towards_a_remote_worker(job, cluster):
    """Rank 0 on this machine as "localhost": that name means a remote worker's own
    machine, so the remote worker's MASTER_ADDR is the address the driver's traffic to
    its host leaves from (as for the rendezvous), and the local worker's stays."""
    _, env = cluster
    r = job.run(["-x", "ER_TEST_TAG", "-np", 2, "-H", "localhost:1,10.77.0.11:1", *print_env_command()],
                timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    envs = worker_envs(r.stdout)
    route = subprocess.run(["ip", "-o", "route", "get", "10.77.0.11"], capture_output=True, text=True, check=True)
    ours = route.stdout.split(" src ")[1].split()[0]
    assert (envs[0]["MASTER_ADDR"], envs[1]["MASTER_ADDR"]) == ("localhost", ours), envs


@needs_torch
def test_unmodified_ddp_script_on_the_namespace_cluster(job, cluster, tmp_path):
    """Two hosts over SSH: MASTER_ADDR is rank 0's host as the driver names it, reachable
    from the other; gloo is told the hosts' interface (their host names resolve nowhere)."""
    _, env = cluster
    r = job.run(["-x", "ER_TEST_TAG", "-x", "GLOO_SOCKET_IFNAME=eth0", "-np", 3, "-H", "10.77.0.11:2,10.77.0.12:1",
                 *ddp(tmp_path, "--steps", 10)], timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = sorted(starts(r.stdout), key=lambda s: s["rank"])
    assert [(s["rank"], s["pg_rank"], s["local_rank"], s["group"]) for s in got] == [(0, 0, 0, 0), (1, 1, 1, 0),
                                                                                     (2, 2, 0, 1)], got
    assert final(r.stdout)[2] == 0.0
