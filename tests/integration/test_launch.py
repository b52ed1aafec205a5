"""End-to-end runs of the real elasticrun / elasticrund / libelasticrun on this machine."""
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, TESTPROG, our_processes


def test_four_workers_join_with_correct_topology(job):
    r = job.run(["-np", 4, "-H", "localhost:2,127.0.0.2:2", TESTPROG, "--topology"])
    assert r.returncode == 0, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if "local_rank" in l)
    want = {
        0: "rank 0 size 4 local_rank 0 local_size 2 cross_rank 0 cross_size 2 host localhost",
        1: "rank 1 size 4 local_rank 1 local_size 2 cross_rank 0 cross_size 2 host localhost",
        2: "rank 2 size 4 local_rank 0 local_size 2 cross_rank 1 cross_size 2 host 127.0.0.2",
        3: "rank 3 size 4 local_rank 1 local_size 2 cross_rank 1 cross_size 2 host 127.0.0.2",
    }
    for rank, text in want.items():
        assert f"[{rank}]<stdout>: {text}" in lines


def test_uneven_hosts_layout(job):
    r = job.run(["-np", 5, "-H", "localhost:3,127.0.0.2:1,127.0.0.3:2", TESTPROG, "--topology"])
    assert r.returncode == 0, r.stderr
    assert "[3]<stdout>: rank 3 size 5 local_rank 0 local_size 1 cross_rank 1 cross_size 3 host 127.0.0.2" in r.stdout
    assert "[4]<stdout>: rank 4 size 5 local_rank 0 local_size 1 cross_rank 2 cross_size 3 host 127.0.0.3" in r.stdout
    assert "[2]<stdout>: rank 2 size 5 local_rank 2 local_size 3 cross_rank 0 cross_size 1 host localhost" in r.stdout


def test_hostfile(job, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# two hosts\nlocalhost slots=1\n127.0.0.2 slots=2\n")
    r = job.run(["--hostfile", hf, TESTPROG, "--topology"])
    assert r.returncode == 0, r.stderr
    assert "[2]<stdout>: rank 2 size 3 local_rank 1 local_size 2" in r.stdout


@pytest.mark.skipif(not (EXAMPLES / "allreduce_check").exists(), reason="allreduce_check not built")
def test_allreduce_check_four_ranks(job):
    r = job.run(["-np", 4, EXAMPLES / "allreduce_check"], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("allreduce_check: OK") == 4


@pytest.mark.skipif(not (EXAMPLES / "allreduce_check").exists(), reason="allreduce_check not built")
def test_a_one_rank_job_runs_every_collective_without_ucx(job):
    # A world of one has no peer: no UCX context is made (its start-up is about 12 ms of a
    # one-rank job's). With a transport UCX cannot find, two ranks fail and one does not.
    r = job.run(["-np", 1, "-x", "UCX_TLS=nosuchtransport", EXAMPLES / "allreduce_check"], timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "allreduce_check: OK" in r.stdout
    r = job.run(["-np", 2, "-x", "UCX_TLS=nosuchtransport", EXAMPLES / "allreduce_check"], timeout=120)
    assert r.returncode != 0 and "ucp_init" in r.stdout + r.stderr


@pytest.mark.skipif(not (EXAMPLES / "allreduce_check").exists(), reason="allreduce_check not built")
def test_allreduce_check_on_uneven_hosts_includes_hierarchical(job):
    # Hosts of 2 and 1 ranks: allreduce_check runs ring, rd and hier (shared memory
    # within the two-rank host, UCX between the hosts' first ranks).
    r = job.run(["-np", 3, "-H", "localhost:2,127.0.0.2:1", EXAMPLES / "allreduce_check"], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("allreduce_check: OK") == 3
    assert "algorithms: ring rd rhd direct twoshot hier" in r.stdout


@pytest.mark.skipif(not (EXAMPLES / "allreduce_check").exists(), reason="allreduce_check not built")
def test_segment_setting_reaches_the_workers_and_a_bad_one_is_refused(job):
    # ELASTICRUN_SEGMENT from the driver's environment: 1 KiB segments make every ring and
    # chain step of allreduce_check's 64 KiB case dozens of chunks, across two "hosts".
    env = {"ELASTICRUN_SEGMENT": "1K"}
    r = job.run(["-np", 3, "-H", "localhost:2,127.0.0.2:1", EXAMPLES / "allreduce_check", "--large", 64 << 10],
                env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("allreduce_check: OK") == 3
    r = job.run(["-np", 2, "-H", "localhost:1,127.0.0.2:1", EXAMPLES / "allreduce_check"],
                env={"ELASTICRUN_SEGMENT": "4G"}, timeout=120)
    assert r.returncode != 0
    assert "ELASTICRUN_SEGMENT='4G' is not a byte count from 1K to 64M" in r.stdout + r.stderr, r.stderr[-3000:]


@pytest.mark.skipif(not (EXAMPLES / "allreduce_check").exists(), reason="allreduce_check not built")
def test_shared_memory_waits_keep_the_network_moving(job):
    # A large receive over UCX can complete while its rank still owes the sender the
    # rendezvous acknowledgement, which only that rank's progress sends. allreduce_check's
    # hierarchical pass runs an alltoall over UCX (560 KB blocks) and then a hierarchical
    # allgather: rank 1, done with the alltoall, waits in shared memory for rank 0, which
    # waits for rank 1's acknowledgement. Unless the shared-memory waits progress UCX, 3 of
    # 8 such runs timed out (1 KiB segments change the timing); three runs here, each with a
    # 20 s collective timeout, so that a hang fails fast.
    for _ in range(3):
        r = job.run(["-x", "ELASTICRUN_COLLECTIVE_TIMEOUT=20", "-np", 3, "-H", "localhost:2,127.0.0.2:1",
                     EXAMPLES / "allreduce_check", "--large", 4096], env={"ELASTICRUN_SEGMENT": "1K"}, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert r.stdout.count("allreduce_check: OK") == 3


@pytest.mark.skipif(not (EXAMPLES / "allreduce_check").exists(), reason="allreduce_check not built")
def test_a_bad_tune_setting_is_refused_on_every_host(job):
    # ELASTICRUN_TUNE is read where the ranks span hosts (here two "hosts" of one machine,
    # the first the remote-looking one): a bad value fails the communicator, naming it.
    r = job.run(["-np", 2, "-H", "127.0.0.2:1,localhost:1", EXAMPLES / "allreduce_check"],
                env={"ELASTICRUN_TUNE": "yes"}, timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert re.search(r"\[\d\]<stdout>: allreduce_check: ERROR .*ELASTICRUN_TUNE='yes' is not 0 or 1", out), out[-3000:]


def test_command_and_its_flags_pass_through(job):
    r = job.run(["-np", 2, "sh", "-c", 'echo "args:$*"', "sh", "--lr", "0.1", "-v", "-np", "7"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("args:--lr 0.1 -v -np 7") == 2


def test_output_prefix_and_output_filename(job, tmp_path):
    out = tmp_path / "logs"
    r = job.run(["-np", 2, "--output-filename", out, "sh", "-c",
                 'printf "line1\\nline2\\npartial"; echo oops >&2'])
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert f"[{rank}]<stdout>: line1" in r.stdout
        assert f"[{rank}]<stdout>: partial" in r.stdout
        assert f"[{rank}]<stderr>: oops" in r.stderr
        assert (out / f"rank.{rank}" / "stdout").read_text() == "line1\nline2\npartial"
        assert (out / f"rank.{rank}" / "stderr").read_text() == "oops\n"


def test_worker_environment_and_x_flag(job):
    r = job.run(["-np", 1, "-x", "FOO=bar", TESTPROG, "--print-env", "FOO", "--print-env", "ELASTICRUN_HOST",
                 "--print-env", "ELASTICRUN_SLOT"])
    assert r.returncode == 0, r.stderr
    assert "[0]<stdout>: FOO=bar" in r.stdout
    assert "[0]<stdout>: ELASTICRUN_HOST=localhost" in r.stdout
    assert "[0]<stdout>: ELASTICRUN_SLOT=0" in r.stdout


# ---- bad input: a clear message and a distinct non-zero exit status ----

@pytest.mark.parametrize("args,code,message", [
    (["--bogus", "true"], 2, "unknown option '--bogus'"),
    (["-np", "0", "true"], 2, "-np 0: need at least one process"),
    (["-np", "5", "-H", "localhost:2,127.0.0.2:2", "true"], 2, "-np 5 but the hosts offer only 4 slots"),
    (["-H", "localhost:two", "true"], 2, "slots 'two' is not a number"),
    (["-H", "a b", "true"], 2, "'a b' is not a valid host name"),
    (["--hostfile", "/nonexistent/hostfile", "true"], 2, "cannot read hostfile '/nonexistent/hostfile'"),
    (["-np", "2"], 2, "no command given"),
    (["-np", "1", "./no-such-program"], 3, "/no-such-program': no such file"),
    (["-np", "1", "no-such-program-in-path"], 3, "command not found in PATH"),
    (["-np", "1", "--ssh-host-key-checking", "maybe", "true"], 2, "expected yes, accept-new or no"),
    (["-np", "1", "--ssh-port", "70000", "true"], 2, "--ssh-port 70000 out of range"),
    (["--=x", "true"], 2, "unknown option '--=x'"),
    (["-np", "1", "--daemon-path", "/nonexistent/elasticrund", "true"], 3,
     "--daemon-path: '/nonexistent/elasticrund': no such file"),        # found by options_fuzz (crashed)
    (["--np", "%value%", "true"], 2, "invalid option or value for '--np'"),  # found by options_fuzz (hung)
    (["--worker-timeout", "0.5", "true"], 2, "--worker-timeout must be 0 (off) or a number of seconds from 1 to 86400"),
    (["--worker-timeout", "-2", "true"], 2, "--worker-timeout must be 0 (off) or a number of seconds"),
    (["--worker-timeout", "1e6", "true"], 2, "--worker-timeout must be 0 (off) or a number of seconds"),
    (["--worker-timeout", "soon", "true"], 2, "the argument ('soon') for option '--worker-timeout' is invalid"),
])
def test_bad_input(job, args, code, message):
    r = job.run(args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert message in r.stderr
    assert "elasticrun:" in r.stderr


def test_command_not_executable(job, tmp_path):
    f = tmp_path / "prog"
    f.write_text("#!/bin/sh\n")
    f.chmod(0o644)
    r = job.run(["-np", 1, f])
    assert r.returncode == 3
    assert f"'{f}' is not executable" in r.stderr


def test_hostfile_with_bad_line_names_it(job, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=2\nnode2 cpus=4\n")
    r = job.run(["--hostfile", hf, "true"])
    assert r.returncode == 2
    assert "line 2" in r.stderr


def test_unreadable_hostfile(job, tmp_path):
    r = job.run(["--hostfile", tmp_path, "true"])  # a directory
    assert r.returncode == 2
    assert "hostfile" in r.stderr


def test_worker_exit_code_fails_the_job_and_names_it(job):
    t0 = time.monotonic()
    r = job.run(["-np", 3, TESTPROG, "--allreduce-seconds", 30, "--fail-rank", 1, "--fail-code", 7])
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert re.search(r"rank 1 \(host 'localhost', slot 1, pid \d+\) exited with code 7", r.stderr), r.stderr
    assert elapsed < 10, f"took {elapsed:.1f}s to fail"


def test_sigkilled_worker_ends_the_job_promptly(job):
    t0 = time.monotonic()
    r = job.run(["-np", 4, "-H", "localhost:2,127.0.0.2:2", TESTPROG, "--allreduce-seconds", 30,
                 "--fail-rank", 2, "--fail-signal", 9])
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert re.search(r"rank 2 \(host '127.0.0.2', slot 0, pid \d+\) was killed by signal 9 \(SIGKILL\)", r.stderr)
    assert elapsed < 10, f"took {elapsed:.1f}s to fail"


def test_worker_killed_from_outside(job):
    p = job.start(["-np", 3, TESTPROG, "--init", "--sleep", 60, "--tag", job.tag])
    pids = wait_for_workers(job, 3)
    os.kill(pids[0], signal.SIGKILL)
    _, err = p.communicate(timeout=15)
    assert p.returncode == 1
    assert "was killed by signal 9 (SIGKILL)" in err


def argv0(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def wait_for_workers(job, n, timeout=20):
    """Pids of the job's testprog workers once all n are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in our_processes(job.tag) if argv0(p).endswith(b"/testprog")]
        if len(pids) == n:
            return sorted(pids)
        time.sleep(0.05)
    raise AssertionError(f"{n} workers did not start")


def worker_and_daemon_on(workers, host):
    """(pid of the worker among `workers` that runs on `host`, pid of its daemon)."""
    worker = next(w for w in workers if f"ELASTICRUN_HOST={host}".encode() in Path(f"/proc/{w}/environ").read_bytes())
    daemon = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert argv0(daemon).endswith(b"elasticrund"), argv0(daemon)
    return worker, daemon


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_driver_stops_everything(job, sig, code):
    p = job.start(["-np", 4, "-H", "localhost:2,127.0.0.2:2", TESTPROG, "--init", "--sleep", 120])
    wait_for_workers(job, 4)
    t0 = time.monotonic()
    p.send_signal(sig)
    _, err = p.communicate(timeout=15)
    assert p.returncode == code, err
    assert "interrupted by SIG" in err
    assert time.monotonic() - t0 < 5
    # the job fixture asserts that no daemon or worker is left


def test_sigkill_to_driver_leaves_no_orphans(job):
    p = job.start(["-np", 3, TESTPROG, "--init", "--sleep", 120])
    wait_for_workers(job, 3)
    p.kill()
    assert p.wait(timeout=5) == -signal.SIGKILL
    # Daemons and workers follow the driver (their death signal) within a few seconds.
    deadline = time.monotonic() + 5
    while our_processes(job.tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert our_processes(job.tag) == []


# Workers that start a helper and exit without stopping it: the helper has its own output
# (so no pipe of the worker's stays open) and is left in the worker's process group.
# Rank 1 exits at once, and its helper ignores SIGTERM, so only the SIGKILL ends it;
# rank 0's helper ends on SIGTERM, and rank 0 runs on meanwhile.
LEAVES_A_HELPER = """
import os, subprocess, time
rank0 = os.environ["RANK"] == "0"
cmd = ["sleep", "60"] if rank0 else ["sh", "-c", "trap '' TERM; exec sleep 60"]
h = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("helper", h.pid, "of", os.getpid(), "in group", os.getpgrp(), flush=True)
if rank0:
    time.sleep(16)
"""


def proc_state(pid):
    """`pid`'s state, parent and process group from /proc, or why they could not be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return {"state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2])}
    except (OSError, IndexError, ValueError) as e:
        return repr(e)


@pytest.mark.parametrize("preload", [[], ["--preload", "json"]], ids=["exec", "fork-server"])
def test_what_a_worker_leaves_running_is_stopped_with_it(job, preload):
    """Exec'd workers and workers forked by the fork server alike: what a worker leaves
    running gets SIGTERM when it exits and SIGKILL 2 s later, while the job goes on (not
    only when the job ends), instead of being reparented to init and running on."""
    p = job.start(["-np", 2, *preload, "/usr/bin/python3", "-c", LEAVES_A_HELPER])
    try:
        helpers, workers = {}, {}
        for line in p.stdout:
            m = re.match(r"\[(\d)\]<stdout>: helper (\d+) of (\d+)", line)
            if m:
                helpers[int(m.group(1))] = int(m.group(2))
                workers[int(m.group(1))] = int(m.group(3))
            if 1 in helpers:
                break
        assert 1 in helpers, f"no helper from rank 1: {helpers}"
        # 2 s of grace from rank 1's exit, and slack for a busy machine (rank 0 runs 16 s;
        # 6 s of slack once fell short in a full run on 2 loaded cores).
        deadline = time.monotonic() + 12
        while helpers[1] in our_processes(job.tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        if helpers[1] in our_processes(job.tag):
            # What /proc and the job say, for the record: twice a loaded full run got here.
            seen = {what: proc_state(pid) for what, pid in (("helper", helpers[1]), ("worker", workers[1]))}
            p.kill()
            p.wait(timeout=30)
            os.set_blocking(p.stderr.fileno(), False)  # a daemon may hold it open still
            err = p.stderr.read() or ""
            pytest.fail(f"rank 1's helper outlived the SIGKILL: {seen}; {line!r}; job stderr: {err[-3000:]}")
        assert p.poll() is None, "the job ended first: this did not test a job that goes on"
        rest = p.stdout.read()  # what the loop above read ahead is there, not in communicate()'s
        assert p.wait(timeout=30) == 0, p.stderr.read()
        helpers.update({int(r): int(h) for r, h in re.findall(r"\[(\d)\]<stdout>: helper (\d+)", rest)})
        assert 0 in helpers, rest
        assert helpers[0] not in our_processes(job.tag), "rank 0's helper outlived the job"
    finally:
        if p.poll() is None:
            p.kill()
    # the job fixture asserts that nothing else is left


def test_a_low_open_file_limit_is_raised_to_the_hard_one(job):
    """Started under a soft limit of 16 open files (hard 4096, or less where this
    process may not have that), the driver raises its own to the hard limit, as the daemon
    does, and the workers inherit it: 8 workers' rendezvous connections and the daemon's
    pipes need more than 16 descriptors in the driver."""
    import resource

    hard = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    if hard < 256:
        pytest.skip(f"this process's hard limit on open files is {hard}")

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, hard))

    r = job.run(["-np", 8, "sh", "-c", f'echo "nofile $(ulimit -Sn)"; exec {TESTPROG} --init'], preexec_fn=low)
    assert r.returncode == 0, r.stderr
    assert sorted(re.findall(r"<stdout>: nofile (\d+)", r.stdout)) == [str(hard)] * 8, r.stdout


def test_a_daemon_stops_reading_output_it_cannot_send_yet(job):
    """A worker writes 200 MiB to stdout while nothing reads the driver's stdout for 3 s,
    so the driver's writes block and it stops reading its daemon. The daemon stops reading
    the worker's pipe once 1 MiB waits to be sent, instead of queueing all of it: its peak
    memory stays small. Every line arrives once the driver's stdout is read again."""
    code = "import sys\nb = (b'x' * 1023 + b'\\n') * 1024\nfor _ in range(200):\n    sys.stdout.buffer.write(b)\n"
    p = job.start(["-np", 1, "/usr/bin/python3", "-c", code])
    try:
        time.sleep(3)
        daemons = [pid for pid in our_processes(job.tag) if argv0(pid).endswith(b"elasticrund")]
        assert len(daemons) == 1, daemons
        status = Path(f"/proc/{daemons[0]}/status").read_text()
        peak_kib = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
        lines = sum(1 for line in p.stdout if line == "[0]<stdout>: " + "x" * 1023 + "\n")
        assert p.wait(timeout=60) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert lines == 200 * 1024
    assert peak_kib < 64 * 1024, f"the daemon held {peak_kib} KiB"


def test_silent_daemon_ends_a_fixed_size_job_after_host_timeout(job):
    """Outside elastic mode a host whose daemon stops answering (SIGSTOP here; a cut link
    behaves the same) ends the job after --host-timeout, naming the host, and nothing is
    left behind: the stopped daemon is killed, and its worker dies with it."""
    p = job.start(["-np", 2, "-H", "localhost:1,127.0.0.2:1", "--host-timeout", 1, TESTPROG, "--init",
                   "--sleep", 60])
    _, daemon = worker_and_daemon_on(wait_for_workers(job, 2), "127.0.0.2")
    os.kill(daemon, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = p.communicate(timeout=30)
    finally:
        try:
            os.kill(daemon, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert p.returncode == 1, err
    assert re.search(r"lost the daemon on host '127\.0\.0\.2': heard nothing from it for \d\.\d s "
                     r"\(--host-timeout\)", err), err
    # 1 s of silence, then up to 4 s for the daemons to stop and 3 s to reap the stopped one.
    assert time.monotonic() - t0 < 12
    # the job fixture asserts that no daemon or worker is left


def test_workers_that_never_join_time_out_once_one_joined(job):
    """Rank 0 uses the library and joins; rank 1 never does: it is late, and the job ends
    after --start-timeout naming it."""
    script = f'if [ "$RANK" = 0 ]; then exec {TESTPROG} --init --sleep 30; else exec sleep 30; fi'
    r = job.run(["-np", 2, "--start-timeout", "1", "sh", "-c", script])
    assert r.returncode == 4, r.stderr
    assert "1 of 2 workers did not join within 1.0 s (rank@host: 1@localhost)" in r.stderr


def test_a_program_that_never_joins_runs_to_its_end(job):
    """A program that does not link libelasticrun (a torchrun script) never joins: nobody
    waits for it, past --start-timeout too."""
    t0 = time.monotonic()
    r = job.run(["-np", 2, "--start-timeout", "1", "sh", "-c", "sleep 2.5; echo rank $RANK of $WORLD_SIZE"])
    assert r.returncode == 0, r.stderr
    assert "rank 1 of 2" in r.stdout and "rank 0 of 2" in r.stdout
    assert time.monotonic() - t0 >= 2.5


def test_secret_never_on_a_command_line(job):
    p = job.start(["-np", 2, "-v", TESTPROG, "--init", "--sleep", 3])
    pids = wait_for_workers(job, 2)
    environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    secret = next(e.split(b"=", 1)[1] for e in environ if e.startswith(b"ELASTICRUN_SECRET="))
    assert len(secret) == 64
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                assert secret not in (d / "cmdline").read_bytes(), f"secret on pid {d.name}'s command line"
            except OSError:
                pass
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert secret.decode() not in out + err


def test_garbage_on_the_rendezvous_port_is_rejected_and_logged(job):
    p = job.start(["-np", 2, "--log-level", "warn", TESTPROG, "--print-env", "ELASTICRUN_RENDEZVOUS_ADDR",
                   "--init", "--sleep", 2, "--allreduce-seconds", 1])
    addr = None
    deadline = time.monotonic() + 20
    while addr is None and time.monotonic() < deadline:
        for pid in wait_for_workers(job, 2):
            for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if e.startswith(b"ELASTICRUN_RENDEZVOUS_ADDR="):
                    addr = e.split(b"=", 1)[1].decode()
    host, port = addr.rsplit(":", 1)
    for junk in (b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096), b"ER\x02\x01\xff\xff\xff\x7f"):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(junk)
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "rejected" in err
    assert out.count("done after") == 2


def test_every_flag_in_help_is_in_the_man_page(job):
    """`--help` and man/elasticrun.1 describe the same flags: each one --help lists has an
    entry in the man page (whose hyphens are escaped, \\-)."""
    r = job.run(["--help"])
    assert r.returncode == 0, r.stderr
    flags = sorted(set(re.findall(r"^\s+(?:-\w, )?--([a-z][a-z-]*)", r.stdout, re.M)))
    assert len(flags) > 20 and "host-timeout" in flags, r.stdout
    man = (ROOT / "man" / "elasticrun.1").read_text().replace("\\-", "-")
    assert [f for f in flags if f"--{f}" not in man] == []
