"""The long-running daemon (`elasticrund --listen`, what systemd runs) and the driver's
--daemon-port: jobs through it, mutual authentication with the cluster secret, rejected
connections, isolation between jobs, and cleaning up after crashed jobs and daemons."""
import hashlib
import hmac
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import ELASTICRUND, EXAMPLES, TESTPROG, our_processes, skip_unless_required

MAGIC = 0x5245
HELLO, AUTH, AUTH_OK, ERROR = 1, 2, 3, 4


def frame(kind, payload):
    return struct.pack("<HBBI", MAGIC, kind, 1, len(payload)) + payload


def field(b):
    return struct.pack("<I", len(b)) + b


def read_frame(sock):
    head = recv_exact(sock, 8)
    magic, kind, _, n = struct.unpack("<HBBI", head)
    assert magic == MAGIC
    return kind, recv_exact(sock, n)


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def proof(secret, label, role, a, b):
    return hmac.new(secret, label + b"\0" + role + b"\0" + a + b, hashlib.sha256).digest()


class Daemon:
    """An `elasticrund --listen` on loopback with its own secret and state directory."""

    def __init__(self, tmp, tag, secret=None, name="d"):
        self.secret = secret or secrets.token_bytes(32)
        self.secret_file = tmp / f"{name}.secret"
        self.secret_file.write_text(self.secret.hex() + "\n")
        self.secret_file.chmod(0o600)
        self.state = tmp / f"{name}.state"
        self.log_path = tmp / f"{name}.log"
        self.tag = tag
        self.proc = None
        self.port = None
        self.starts = 0  # "listening" lines seen: the log is appended to across restarts

    def start(self, address="127.0.0.1:0", netns=None, prefix=()):
        cmd = [*prefix, str(ELASTICRUND), "--listen", address, "--secret-file", str(self.secret_file),
               "--state-dir", str(self.state)]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stderr=self.log, env={**os.environ, "ER_TEST_TAG": self.tag})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = re.findall(r"listening on \S+:(\d+)", self.log_path.read_text())
            if m and len(m) > self.starts:
                self.port = int(m[-1])
                self.starts += 1
                return self
            assert self.proc.poll() is None, self.log_path.read_text()
            time.sleep(0.02)
        raise AssertionError("daemon did not start: " + self.log_path.read_text())

    def text(self):
        return self.log_path.read_text()

    def wait_log(self, pattern, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the daemon log:\n{self.text()}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.log.close()

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@pytest.fixture
def daemon(tmp_path, job):
    d = Daemon(tmp_path, job.tag).start()
    yield d
    d.stop()
    assert d.proc.returncode == 0, d.text()


def through(daemon, secret_file=None):
    return ["-x", "ER_TEST_TAG", "--daemon-port", daemon.port, "--daemon-secret-file",
            secret_file or daemon.secret_file]


def test_jobs_run_through_the_daemon_one_after_another(job, daemon):
    for n in (3, 2):
        r = job.run([*through(daemon), "-np", n, EXAMPLES / "allreduce_check"], timeout=120)
        assert r.returncode == 0, r.stderr + daemon.text()
        assert r.stdout.count("allreduce_check: OK") == n
    # Each job ran in a job process of its own, which ended cleanly after its driver.
    daemon.wait_log(r"(?s)ended with code 0.*ended with code 0")
    starts = re.findall(r"job from \S+ started as process (\d+)", daemon.text())
    ends = re.findall(r"job from \S+ \(process (\d+)\) ended with code 0", daemon.text())
    assert len(starts) == 2 and sorted(starts) == sorted(ends), daemon.text()
    assert daemon.proc.poll() is None


def test_job_secret_never_on_a_command_line(job, daemon):
    """Neither the cluster secret nor the job's own secret (ELASTICRUN_SECRET, which the
    driver makes per job and sends to the daemon's job process inside the Config frame, and
    which that gives its workers in their environment) is on any process's command line
    while the job runs: the driver, the listening daemon, its job process, the workers."""
    p = job.start([*through(daemon), "-np", 2, TESTPROG, "--sleep", "30"])
    try:
        job_pid = int(daemon.wait_log(r"started as process (\d+)").group(1))
        deadline = time.monotonic() + 10
        workers = []
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = [pid for pid in our_processes(job.tag)
                       if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/testprog")]
            time.sleep(0.05)
        assert len(workers) == 2, our_processes(job.tag)
        secrets_seen = {re.search(rb"(?:^|\0)ELASTICRUN_SECRET=([0-9a-f]*)\0", Path(f"/proc/{w}/environ").read_bytes())
                        .group(1) for w in workers}
        assert len(secrets_seen) == 1, secrets_seen
        job_secret = secrets_seen.pop()
        assert len(job_secret) == 64 and job_secret != daemon.secret.hex().encode(), job_secret
        # Every process on the machine, not only the tagged ones, for the secrets (random:
        # nothing else holds them); the tagged ones for a --secret option of any kind.
        tagged = set(our_processes(job.tag))
        checked = set()
        for d in Path("/proc").iterdir():
            try:
                cmdline = (d / "cmdline").read_bytes() if d.name.isdigit() else None
            except OSError:
                continue
            if cmdline is None:
                continue
            for secret in (job_secret, daemon.secret.hex().encode()):
                assert secret not in cmdline and secret.upper() not in cmdline, (d.name, cmdline)
            if int(d.name) in tagged:
                assert b"--secret" not in cmdline or b"--secret-file" in cmdline, (d.name, cmdline)
            checked.add(int(d.name))
        assert Path(f"/proc/{job_pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"elasticrund")
        want = {"driver": p.pid, "daemon": daemon.proc.pid, "job process": job_pid, "worker 1": workers[0],
                "worker 2": workers[1]}
        assert all(pid in checked and pid in tagged for pid in want.values()), (want, sorted(checked), tagged)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)


def test_wrong_cluster_secret_is_refused_and_logged(job, daemon, tmp_path):
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(secrets.token_hex(32))
    wrong.chmod(0o600)
    r = job.run([*through(daemon, wrong), "-np", 1, TESTPROG], timeout=30)
    assert r.returncode == 3, r.stderr
    assert "refused us" in r.stderr and "cluster secret" in r.stderr, r.stderr
    daemon.wait_log(r"rejected connection from 127\.0\.0\.1:\d+: authentication failed")
    # The daemon keeps serving.
    r = job.run([*through(daemon), "-np", 1, TESTPROG], timeout=30)
    assert r.returncode == 0, r.stderr


def test_driver_refuses_a_daemon_that_cannot_prove_the_secret(job, tmp_path):
    """Mutual authentication: something listening on the port that does not know the
    cluster secret gets the driver's proof but not the job."""
    secret_file = tmp_path / "s"
    secret_file.write_text(secrets.token_hex(32))
    secret_file.chmod(0o600)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    got = {}

    def impostor():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(frame(HELLO, field(secrets.token_bytes(32))))
            got["auth"] = read_frame(conn)
            conn.sendall(frame(AUTH_OK, field(secrets.token_bytes(32))))
            try:
                got["after"] = conn.recv(65536)
            except OSError:
                got["after"] = b""

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    r = job.run(["--daemon-port", srv.getsockname()[1], "--daemon-secret-file", secret_file, "-np", 1, TESTPROG],
                timeout=30)
    t.join(10)
    srv.close()
    assert r.returncode == 3, r.stderr
    assert "could not prove the cluster secret" in r.stderr, r.stderr
    assert got["auth"][0] == AUTH
    assert got["after"] == b"", "the driver sent something (the job config) to an unproven daemon"


def test_rejected_connections_close_alone(job, daemon):
    """Garbage, an oversized frame, a replayed proof, silence: each closes its own
    connection with a logged reason; a connection with the right proof is accepted."""
    def closed(sock):
        sock.settimeout(10)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        return True

    silent = daemon.connect()  # says nothing: closed at the handshake timeout
    with daemon.connect() as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert closed(s)
    with daemon.connect() as s:
        s.sendall(struct.pack("<HBBI", MAGIC, AUTH, 1, 1 << 20))
        assert closed(s)
    # A proof made for one connection's nonce is worthless on another: replay fails.
    with daemon.connect() as s:
        _, hello = read_frame(s)
        server_nonce = hello[4:]
        client_nonce = secrets.token_bytes(32)
        good = proof(daemon.secret, b"er-client", b"driver", server_nonce, client_nonce)
        recorded = frame(AUTH, field(b"driver") + field(client_nonce) + field(good))
        s.sendall(recorded)
        kind, body = read_frame(s)
        assert kind == AUTH_OK  # the right proof is accepted ...
        assert body[4:] == proof(daemon.secret, b"er-server", b"driver", client_nonce, server_nonce)
    with daemon.connect() as s:
        read_frame(s)
        s.sendall(recorded)  # ... and the same bytes replayed are not
        kind, _ = read_frame(s)
        assert kind == ERROR
        assert closed(s)
    daemon.wait_log(r"rejected connection from \S+: bad frame magic")
    daemon.wait_log(r"rejected connection from \S+: .*(exceeds|too large)")
    daemon.wait_log(r"rejected connection from \S+: authentication failed")
    assert closed(silent)
    daemon.wait_log(r"rejected connection from \S+: no authentication within the handshake timeout")
    silent.close()
    r = job.run([*through(daemon), "-np", 2, TESTPROG], timeout=30)
    assert r.returncode == 0, r.stderr


def test_jobs_are_isolated(job, daemon):
    """Two jobs on one daemon: killing one job's driver ends that job's workers only."""
    victim_tag = job.tag + "-victim"
    victim = subprocess.Popen(
        [str(Path(ELASTICRUND).parent.parent / "cmd" / "elasticrun"), *map(str, through(daemon)), "-np", "2",
         str(TESTPROG), "--sleep", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**job.env(), "ER_TEST_TAG": victim_tag})
    survivor = job.start([*through(daemon), "-np", 2, TESTPROG, "--sleep", "4"])
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(re.findall("started as process", daemon.text())) < 2:
            time.sleep(0.05)
        while time.monotonic() < deadline and len(our_processes(victim_tag)) < 3:
            time.sleep(0.05)
        assert len(our_processes(victim_tag)) >= 3  # driver + 2 workers
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=10)
        deadline = time.monotonic() + 5
        while our_processes(victim_tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert our_processes(victim_tag) == [], "the killed job's workers outlived their driver"
        out, err = survivor.communicate(timeout=60)
        assert survivor.returncode == 0, err
    finally:
        for p in (victim, survivor):
            if p.poll() is None:
                p.kill()
                p.communicate()


def leftover_sleeper(job, daemon, seconds, flags=()):
    """Starts a job whose worker leaves a background child (like a data loader) in its
    process group; returns (driver, pid of the child, pid of the job process)."""
    marker = f"{seconds}"
    p = job.start([*through(daemon), *flags, "-np", 1, "/bin/sh", "-c", f"sleep {marker} & echo ready; wait"])
    assert "ready" in p.stdout.readline()
    job_pid = int(daemon.wait_log(r"started as process (\d+)").group(1))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sleepers = [pid for pid in our_processes(job.tag)
                    if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{marker}\0".encode()]
        if sleepers:
            return p, sleepers[0], job_pid
        time.sleep(0.05)
    raise AssertionError("the worker's child did not start")


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_daemon_cleans_up_after_a_crashed_job(job, daemon):
    driver, sleeper, job_pid = leftover_sleeper(job, daemon, 531.25)
    os.kill(job_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper), "the crashed job's leftover process was not killed"
    daemon.wait_log(rf"process {job_pid}\) killed by signal 9")
    driver.communicate(timeout=20)
    assert driver.returncode != 0
    assert not list(daemon.state.glob("job.*")), list(daemon.state.iterdir())


def test_silent_job_process_is_taken_for_gone_and_cleans_up_when_it_wakes(job, daemon):
    """The job process serving our job on a listening daemon stops (SIGSTOP): its socket
    stays open and its kernel answers keep-alives, so only its missing heartbeats tell.
    After --host-timeout the driver gives the host up (exit 1, fixed-size job) and closes
    the connection; continued, the job process finds it closed and stops its workers,
    background children included."""
    driver, sleeper, job_pid = leftover_sleeper(job, daemon, 533.5, ["--host-timeout", 1])
    os.kill(job_pid, signal.SIGSTOP)
    try:
        _, err = driver.communicate(timeout=20)
    finally:
        os.kill(job_pid, signal.SIGCONT)
    assert driver.returncode == 1, err
    assert re.search(r"lost the daemon on host 'localhost': heard nothing from it for \d\.\d s "
                     r"\(--host-timeout\)", err), err
    deadline = time.monotonic() + 10
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper), "the woken job process left its worker's child running"


def test_restarted_daemon_kills_what_a_crash_left(job, daemon):
    driver, sleeper, job_pid = leftover_sleeper(job, daemon, 532.75)
    # The whole daemon dies at once (stopped first so that it cannot clean up).
    daemon.proc.send_signal(signal.SIGSTOP)
    os.kill(job_pid, signal.SIGKILL)
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)
    driver.communicate(timeout=20)
    assert driver.returncode != 0
    time.sleep(0.3)
    assert alive(sleeper), "precondition: the worker's child outlives a SIGKILLed daemon"
    assert list(daemon.state.glob("job.*")), "the job left no record"
    daemon.start()
    daemon.wait_log(r"reclaimed 1 job\(s\) left by an earlier daemon; killed 1 leftover worker group\(s\)")
    deadline = time.monotonic() + 5
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper)
    assert not list(daemon.state.glob("job.*"))


@pytest.mark.parametrize("args, message", [
    (["--listen", "12345678"], "bad --listen"),
    (["--listen", "nowhere:80"], "bad listen address"),
    (["--listen", "127.0.0.1:0", "--secret-file", "/nonexistent/secret"], "cannot read secret file"),
    (["--listen", "127.0.0.1:0", "--stdio"], "exclude each other"),
    ([], "choose a mode"),
    # Boost 1.74's message formatting looped for ever on a value holding its placeholder.
    (["--stdio", "--job-pad-fd", "%value%"], "invalid option or value for '--job-pad-fd'"),
    (["--stdio", "--job-pad-fd", "x"], "the argument ('x') for option '--job-pad-fd' is invalid"),
])
def test_daemon_bad_input(tmp_path, args, message):
    secret = tmp_path / "s"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    if "--secret-file" not in args and "--listen" in args:
        args = [*args, "--secret-file", str(secret)]
    r = subprocess.run([str(ELASTICRUND), *args, "--state-dir", str(tmp_path / "st")], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr


def test_daemon_refuses_a_readable_secret_file_and_a_second_instance(tmp_path, daemon):
    loose = tmp_path / "loose"
    loose.write_text(secrets.token_hex(32))
    loose.chmod(0o644)
    r = subprocess.run([str(ELASTICRUND), "--listen", "127.0.0.1:0", "--secret-file", str(loose), "--state-dir",
                        str(tmp_path / "x")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "accessible by other users" in r.stderr, r.stderr
    short = tmp_path / "short"
    short.write_text("abcd")
    short.chmod(0o600)
    r = subprocess.run([str(ELASTICRUND), "--listen", "127.0.0.1:0", "--secret-file", str(short), "--state-dir",
                        str(tmp_path / "y")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "64 hexadecimal digits" in r.stderr, r.stderr
    r = subprocess.run([str(ELASTICRUND), "--listen", "127.0.0.1:0", "--secret-file", str(daemon.secret_file),
                        "--state-dir", str(daemon.state)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "another elasticrund --listen" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["other-owner", "symlink", "file"])
def test_daemon_refuses_a_state_directory_others_could_write(tmp_path, kind):
    """Job records name the processes a restarted daemon kills: a state directory that
    another user owns (one who created /tmp/elasticrund-UID first, mode 0777 and a
    planted record naming our process), or a symbolic link its owner could point
    elsewhere, is refused before anything in it is read, and the planted victim lives."""
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    victim = subprocess.Popen(["sleep", "30"])
    try:
        planted = tmp_path / "planted"
        planted.mkdir()
        start = Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (planted / "job.99999").write_text(f"job 99999 1\n{victim.pid} {start}\n")
        state = tmp_path / "state"
        if kind == "other-owner":
            if os.geteuid() != 0:
                pytest.skip("giving a directory to another user needs root")
            planted.rename(state)
            os.chown(state, 65534, 65534)
            state.chmod(0o777)
            message = "it belongs to uid 65534, not to this daemon's (0)"
        elif kind == "symlink":
            state.symlink_to(planted)
            message = "it is a symbolic link (name the directory itself)"
        else:
            state.write_text("")
            message = "it is not a directory"
        r = subprocess.run([str(ELASTICRUND), "--listen", "127.0.0.1:0", "--secret-file", str(secret),
                            "--state-dir", str(state)], capture_output=True, text=True, timeout=10)
        assert r.returncode == 1, r.stderr
        assert f"elasticrund: refusing state directory '{state}': {message}" in r.stderr, r.stderr
        assert victim.poll() is None, "the planted record's process was killed"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("args, message", [
    (["--daemon-port", "0"], "out of range"),
    (["--daemon-port", "70000"], "out of range"),
    (["--daemon-port", "7210", "--daemon-secret-file", "/nonexistent"], "cannot read secret file"),
])
def test_driver_daemon_flags_bad_input(job, args, message):
    r = job.run([*args, "-np", 1, TESTPROG], timeout=20)
    assert r.returncode in (2, 3), r.stderr
    assert message in r.stderr, r.stderr


def test_nothing_listening_fails_fast(job, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    secret = tmp_path / "s"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    t0 = time.monotonic()
    r = job.run(["--daemon-port", port, "--daemon-secret-file", secret, "-np", 1, TESTPROG], timeout=20)
    assert r.returncode == 3, r.stderr
    assert "cannot connect" in r.stderr and "refused" in r.stderr.lower(), r.stderr
    assert time.monotonic() - t0 < 5


# ---- daemons running inside the namespace hosts of scripts/testcluster ----

from conftest import namespace_cluster  # noqa: E402
from test_ssh import HOSTS  # noqa: E402
from test_sgd import check_commits, finals, reference  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(3, 2)


@pytest.fixture
def host_daemons(tmp_path, job, cluster):
    secret = secrets.token_bytes(32)
    ds = [Daemon(tmp_path, job.tag, secret=secret, name=f"h{i + 1}").start("0.0.0.0:7210", netns=f"er-h{i + 1}")
          for i in range(len(HOSTS))]
    yield ds
    for d in ds:
        d.stop()


def test_daemons_in_namespace_hosts_run_a_job(job, host_daemons):
    d = host_daemons[0]
    r = job.run(["-x", "ER_TEST_TAG", "--daemon-port", 7210, "--daemon-secret-file",
                 d.secret_file, "-np", 6, "-H", "10.77.0.11:3,10.77.0.12:1,10.77.0.13:2", TESTPROG, "--topology"],
                timeout=120)
    assert r.returncode == 0, r.stderr
    for w in ["rank 0 size 6 local_rank 0 local_size 3 cross_rank 0 cross_size 3 host 10.77.0.11",
              "rank 3 size 6 local_rank 0 local_size 1 cross_rank 1 cross_size 3 host 10.77.0.12",
              "rank 5 size 6 local_rank 1 local_size 2 cross_rank 1 cross_size 2 host 10.77.0.13"]:
        assert w in r.stdout, r.stdout
    for h in host_daemons:
        h.wait_log(r"job from 10\.77\.0\.1:\d+ \(process \d+\) ended with code 0")


def test_daemon_killed_on_one_host_job_continues(job, host_daemons, tmp_path):
    """Elastic job over the daemons; one host's whole daemon is SIGKILLed mid-training:
    that host drops out and training goes on without losing committed state."""
    d = host_daemons[0]
    hosts = tmp_path / "discover"
    hosts.write_text("#!/bin/sh\necho 10.77.0.11:1\necho 10.77.0.12:1\necho 10.77.0.13:1\n")
    hosts.chmod(0o755)
    progress = tmp_path / "progress"
    args = ["--steps", 200, "--dim", 64, "--batch", 48, "--commit-every", 5]
    p = job.start(["-x", "ER_TEST_TAG", "--daemon-port", 7210, "--daemon-secret-file",
                   d.secret_file, "--min-np", 2, "--max-np", 3, "--host-discovery-script", hosts,
                   EXAMPLES / "elastic_sgd", *args, "--step-ms", 10, "--progress-file", progress])

    def committed():
        try:
            return int(progress.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    try:
        deadline = time.monotonic() + 60
        while committed() < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert committed() >= 30, f"training did not reach the commit of step 30 in 60 s (at {committed()})"
        victim = host_daemons[2]
        job_pid = int(victim.wait_log(r"started as process (\d+)").group(1))
        # Its worker's shared-memory directory, which the daemon's successor must remove.
        assert list(Path("/dev/shm").glob(f"elasticrun.{job_pid}.*")), sorted(Path("/dev/shm").glob("elasticrun.*"))[:20]
        victim.proc.send_signal(signal.SIGKILL)
        os.kill(job_pid, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-3000:]
    got = finals(out)
    assert len(got) == 2 and all(g == reference(args) for g in got), got
    check_commits(out, 200, min_epoch=2)
    assert "10.77.0.13" in err
    # systemd would restart the daemon: the new one clears what the killed one left.
    victim.start("0.0.0.0:7210", netns="er-h3")
    victim.wait_log(r"reclaimed 1 job\(s\) left by an earlier daemon")
    assert not list(Path("/dev/shm").glob(f"elasticrun.{job_pid}.*"))


def test_systemd_unit_command_line_starts_the_daemon(tmp_path):
    """The unit's ExecStart, expanded the way systemd does with the shipped example of
    /etc/default/elasticrund, starts a daemon (in a network namespace of its own)."""
    from conftest import BUILD, ROOT
    import shlex
    unit = (BUILD / "daemon" / "elasticrund.service").read_text()
    env = {}
    for line in unit.splitlines():
        if line.startswith("Environment="):
            for kv in shlex.split(line[len("Environment="):]):
                k, v = kv.split("=", 1)
                env[k] = v
    for line in (ROOT / "daemon" / "elasticrund.default").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = shlex.split(v)[0] if v.startswith('"') else v
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    secret.chmod(0o600)
    env["ELASTICRUND_SECRET_FILE"] = str(secret)
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    argv = []
    for word in exec_start.split():
        m = re.fullmatch(r"\$\{(\w+)\}", word) or None
        if m:
            argv.append(env[m.group(1)])
        elif word.startswith("$"):
            argv.extend(env.get(word[1:], "").split())
        else:
            argv.append(word)
    assert argv[0].endswith("/elasticrund")
    argv[0] = str(ELASTICRUND)
    argv[argv.index("--state-dir") + 1] = str(tmp_path / "run")
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        skip_unless_required("netns", "cannot make a network namespace here")
    p = subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        assert "listening on 0.0.0.0:7210" in line, line + p.stderr.read() if p.poll() is not None else line
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=10)
    assert p.returncode == 0


# ---- the daemon's watchdog: a driver that falls silent is taken for gone ----

CONTROL_PROTOCOL = 6  # msg::kControlProtocol


def config_frame(heartbeat_ms=1000, timeout_ms=10000, protocol=CONTROL_PROTOCOL, preload=(), preempt_grace_ms=0):
    payload = field(secrets.token_bytes(32)) + field(b"127.0.0.1:1") + field(b"localhost") + field(b"/")
    if protocol > 1:  # version 1 ended the frame here
        payload += struct.pack("<III", protocol, heartbeat_ms, timeout_ms)
    if protocol >= 4:  # the preload list (versions 2 and 3 ended the frame before it)
        payload += struct.pack("<I", len(preload)) + b"".join(field(m.encode()) for m in preload)
    if protocol >= 6:  # the preemption grace (versions 4 and 5 ended the frame before it)
        payload += struct.pack("<I", preempt_grace_ms)
    return frame(30, payload)


def spawn_frames(command, heartbeat_ms=1000, timeout_ms=10000):
    argv = struct.pack("<I", len(command)) + b"".join(field(a.encode()) for a in command)
    env = struct.pack("<I", 0)
    spawn = struct.pack("<IQii", 0, 1, 0, 1) + argv + env + struct.pack("<i", 1)  # local_size
    return config_frame(heartbeat_ms, timeout_ms) + frame(31, spawn)


def frame_kinds(data):
    kinds = []
    while len(data) >= 8:
        _, kind, _, n = struct.unpack("<HBBI", data[:8])
        kinds.append(kind)
        data = data[8 + n:]
    return kinds


@pytest.mark.parametrize("protocol", [1, CONTROL_PROTOCOL - 1, CONTROL_PROTOCOL + 1])
def test_daemon_refuses_a_driver_of_another_protocol_version(job, protocol):
    d = subprocess.Popen([str(ELASTICRUND), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=job.env())
    _, err = d.communicate(config_frame(protocol=protocol), timeout=10)
    assert d.returncode == 1
    assert (f"the driver speaks control protocol {protocol}, this elasticrund {CONTROL_PROTOCOL}: install the "
            f"same elasticrun version on every host").encode() in err, err


def test_driver_refuses_a_daemon_of_another_protocol_version(job, tmp_path):
    """A daemon from before the protocol number (its ready frame ends after the host
    name) is refused by name at launch, not taken for a malformed stream."""
    old = tmp_path / "elasticrund-v1"
    old.write_text("#!/usr/bin/python3\nimport struct, sys\n"
                   f"sys.stdout.buffer.write(struct.pack('<HBBI', {MAGIC}, 34, 1, 8) + struct.pack('<II', 77, 0))\n"
                   "sys.stdout.flush()\nsys.stdin.buffer.read()\n")
    old.chmod(0o755)
    r = job.run(["--daemon-path", old, "-np", 1, "true"], timeout=30)
    assert r.returncode == 3, r.stderr
    assert ("starting daemon on 'localhost': its elasticrund speaks control protocol 1, this elasticrun "
            f"{CONTROL_PROTOCOL}: install the same elasticrun version on every host") in r.stderr, r.stderr


@pytest.mark.parametrize("heartbeat_ms, timeout_ms", [(0, 10000), (1000, 1500), (1000, 0xffffffff),
                                                       (0x80000000, 10000)])
def test_daemon_rejects_bad_heartbeat_settings(job, heartbeat_ms, timeout_ms):
    d = subprocess.Popen([str(ELASTICRUND), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=job.env())
    _, err = d.communicate(spawn_frames(["/bin/true"], heartbeat_ms, timeout_ms), timeout=10)
    assert d.returncode == 1
    assert b"rejected malformed config frame: bad heartbeat settings" in err, err
    assert not [p for p in our_processes(job.tag) if p != d.pid]


def test_daemon_rejects_a_preemption_grace_over_an_hour(job):
    d = subprocess.Popen([str(ELASTICRUND), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=job.env())
    _, err = d.communicate(config_frame(preempt_grace_ms=3600 * 1000 + 1), timeout=10)
    assert d.returncode == 1
    assert b"rejected malformed config frame: preemption grace 3600001 ms is over the most, 3600000 ms" in err, err


@pytest.mark.parametrize("name", ["", "torch-x", "os;import sys", "a..b", "1st"])
def test_daemon_rejects_a_preload_name_that_is_no_module_name(job, name):
    """The names become the fork server's imports: one that is no dotted module name is
    a malformed config, named, and nothing starts."""
    d = subprocess.Popen([str(ELASTICRUND), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=job.env())
    _, err = d.communicate(config_frame(preload=["json", name]), timeout=10)
    assert d.returncode == 1
    assert f"rejected malformed config frame: bad preload module name '{name}'".encode() in err, err
    assert not [p for p in our_processes(job.tag) if p != d.pid]


def stdio_daemon_running(job, command):
    """An `elasticrund --stdio` whose driver (this test, through its pipes) set a 300 ms
    heartbeat and a 1.5 s host timeout and started `command` as one worker, running."""
    d = subprocess.Popen([str(ELASTICRUND), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=job.env())
    d.stdin.write(spawn_frames(command, heartbeat_ms=300, timeout_ms=1500))
    d.stdin.flush()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not [p for p in our_processes(job.tag) if p != d.pid]:
        time.sleep(0.05)
    if not [p for p in our_processes(job.tag) if p != d.pid]:
        d.kill()
        d.wait(timeout=10)
        raise AssertionError("the worker did not start")
    return d


@pytest.mark.parametrize("beating", [True, False])
def test_daemon_stops_workers_when_the_driver_falls_silent(job, beating):
    """The config sets the heartbeat (300 ms here) and the host timeout (1.5 s here; the
    driver's --host-timeout): a daemon that hears nothing for that long stops its workers
    and exits, as it does when its channel closes. A cut link that never comes back
    shows no error on the daemon's side. The daemon beats too, so that the driver can
    tell a silent host from a quiet one."""
    d = stdio_daemon_running(job, ["/bin/sleep", "60"])
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4:
            if beating:
                d.stdin.write(frame(39, b""))
                d.stdin.flush()
            if d.poll() is not None:
                break
            time.sleep(0.3)
        if beating:
            assert d.poll() is None, d.stderr.read().decode()
            d.stdin.close()
            d.wait(timeout=10)
            kinds = frame_kinds(d.stdout.read())
            # ready, started, then a heartbeat every 300 ms for the 4 s (some slack for load)
            assert kinds[:2] == [34, 35], kinds
            assert kinds.count(39) >= 6, kinds
        else:
            assert d.poll() == 1
            assert time.monotonic() - t0 < 3.5
            assert b"no word from the driver for 1.5 s" in d.stderr.read()
    finally:
        d.stdin.close()
        d.wait(timeout=10)


def test_a_stopping_daemon_gives_up_a_driver_that_reads_nothing(job):
    """Told to shut down, after which its driver reads nothing (stopped, hung, or behind a
    link cut without an error) while a worker floods its output: the daemon holds 1 MiB
    for the driver and then leaves the worker's pipes unread. After the kill (the grace
    is 100 ms here) the host timeout (1.5 s) bounds the wait for the driver to read; the
    daemon then drops what is left and ends, with the shutdown's status. It used to wait
    for ever, its dead worker's pipes never read to their end."""
    d = stdio_daemon_running(job, ["/usr/bin/yes", "flood"])
    try:
        time.sleep(0.5)  # far more than `yes` needs to fill the pipe and the 1 MiB held
        d.stdin.write(frame(33, struct.pack("<I", 100)))  # Shutdown, grace 100 ms
        d.stdin.flush()
        stopped = time.monotonic()
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the daemon still waits for a driver that reads nothing, 10 s after the shutdown")
        took = time.monotonic() - stopped
        err = d.stderr.read().decode()
        assert d.returncode == 0, err
        assert re.search(r"the driver read nothing for 1\.5 s while the job stopped; dropping \d+ bytes", err), err
        assert 1.5 <= took < 6, f"ended {took:.1f} s after the shutdown:\n{err}"
        assert not [p for p in our_processes(job.tag) if p != d.pid]
    finally:
        d.kill()
        d.stdin.close()
        d.wait(timeout=10)


def test_a_stopping_daemon_removes_shared_memory_at_once(job):
    """SIGTERM to a daemon (a scheduler ending the job: scancel, preemption) whose worker
    ignores SIGTERM: the daemon stops it (SIGKILL after its 2 s grace), but removes the
    worker's /dev/shm directories at once, while it waits: a scheduler's own SIGKILL
    (Slurm's KillWait) may end the daemon before the worker is gone."""
    p = job.start(["-np", 1, "/bin/sh", "-c", "trap '' TERM; sleep 30"])
    daemon, deadline = None, time.monotonic() + 20
    while time.monotonic() < deadline:
        daemon = next((pid for pid in our_processes(job.tag)
                       if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"elasticrund")), None)
        if daemon and any(e.startswith(f"elasticrun.{daemon}.") and not e.endswith(".errors")
                          for e in os.listdir("/dev/shm")):
            break
        time.sleep(0.05)
    mine = sorted(e for e in os.listdir("/dev/shm") if e.startswith(f"elasticrun.{daemon}."))
    assert mine, "the worker got no shared-memory directory"
    os.kill(daemon, signal.SIGTERM)
    time.sleep(0.5)
    assert Path(f"/proc/{daemon}").exists(), "the daemon did not wait for its worker"
    left = sorted(e for e in os.listdir("/dev/shm") if e.startswith(f"elasticrun.{daemon}."))
    assert not left, f"left while the daemon stops: {left} (of {mine})"
    p.communicate(timeout=30)


def test_a_daemon_of_another_pid_namespace_keeps_its_shared_memory(job):
    """A job whose driver and daemon run in a PID namespace of their own (a container
    sharing /dev/shm with the host, --ipc=host): its daemon's directories name a pid of
    that namespace (2, say), which here may be nobody's, or anybody's. The names carry
    the namespace, and a daemon started here (by a local job, which first cleans up the
    directories of dead daemons) leaves them alone; their own daemon removes them when
    that job ends."""
    from conftest import ELASTICRUN
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode != 0:
        skip_unless_required("netns", "cannot make a PID namespace here")
    ours = str(os.stat("/proc/self/ns/pid").st_ino)
    # Pids 300 and up in there: numbers no process has here (this namespace's low pids
    # are its init and kernel threads), so that a daemon here that took the directories
    # for its own namespace's would find their daemon dead and remove them.
    burn = 'i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done; exec "$@"'
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", burn, "sh", str(ELASTICRUN),
                          "-np", "1", "sleep", "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job.env())
    theirs = []
    try:
        deadline = time.monotonic() + 20
        while not theirs and time.monotonic() < deadline:
            theirs = [d for d in Path("/dev/shm").glob("elasticrun.*.*.0.*") if d.name.split(".")[2] != ours]
            time.sleep(0.05)
        assert theirs, sorted(d.name for d in Path("/dev/shm").glob("elasticrun.*"))
        dead_here = [d for d in theirs if not Path(f"/proc/{d.name.split('.')[1]}").exists()]
        assert dead_here == theirs, f"{theirs}: their daemon's pid is alive in this namespace too"
        r = job.run(["-np", 1, "true"], timeout=60)
        assert r.returncode == 0, r.stderr
        assert all(d.exists() for d in theirs), theirs
    finally:
        # unshare does not pass signals on: the driver is its child (pid 1 in there).
        for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGTERM)
        p.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(d.exists() for d in theirs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(d.exists() for d in theirs), theirs


def test_the_open_file_limit_is_raised_to_the_hard_limit_with_a_cap(job, tmp_path):
    """elasticrun and elasticrund raise their soft limit on open files (a driver holds a
    connection per worker, a daemon pipes per worker) to the hard limit, and the workers
    inherit it: under the driver (its local daemon is its child), and under a listening
    daemon started on its own with a soft limit of 256. (The cap at 65536 cannot be
    reached here: this machine's hard limit cannot be raised above 20,000.)"""
    from conftest import ELASTICRUN
    r = subprocess.run(["prlimit", "--nofile=256:8192", str(ELASTICRUN), "-np", "1", "sh", "-c", "ulimit -Sn"],
                       capture_output=True, text=True, env=job.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "[0]<stdout>: 8192" in r.stdout, r.stdout
    d = Daemon(tmp_path, job.tag).start(prefix=["prlimit", "--nofile=256:8192"])
    try:
        r = job.run([*through(d), "-np", 1, "sh", "-c", "ulimit -Sn"], timeout=60)
        assert r.returncode == 0, r.stderr + d.text()
        assert "[0]<stdout>: 8192" in r.stdout, r.stdout
    finally:
        d.stop()
