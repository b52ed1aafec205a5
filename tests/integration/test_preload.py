"""elasticrun --preload: Python workers forked by a fork server per host (daemon/fork_server.py)
that imported the modules once, instead of new interpreters. A worker must not be able to
tell, but for the modules it finds imported: each test runs the same job with and without
--preload and compares what the workers saw and how they ended, as the driver reports it.
Workers run Debian's /usr/bin/python3; the tests that preload torch skip without it."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, our_processes
from test_daemon import Daemon, through
from test_torchrun import DDP, PYTHON, Streamed, final, lines, needs_torch, starts

# What a worker reports about itself, as a module (script and -m) or imported by -c code.
PROBE = r'''
import sys
FIRST, TORCH_FIRST = sorted(globals()), "torch" in sys.modules
import atexit, ctypes, json, os, signal, threading, time


def report(first=None, torch_first=None, file=None):
    import numpy, torch
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS", "PROBE_X"]
    info = {
        "env": {k: os.environ.get(k) for k in names},
        "c_env": {k: (libc.getenv(k.encode()) or b"").decode() for k in names},
        "threads": torch.get_num_threads(), "argv": sys.argv, "orig_argv": sys.orig_argv, "file": file,
        "path0": sys.path[0], "globals": first, "cwd": os.getcwd(), "flags": [sys.stdout.write_through,
        sys.flags.dont_write_bytecode], "stdin": os.read(0, 10).decode(), "own_group": os.getpgrp() == os.getpid(),
        "signals": {n: str(signal.getsignal(getattr(signal, n))) for n in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGCHLD",
                                                                          "SIGXFSZ", "SIGUSR1")},
        "cmdline": [a.decode() for a in open("/proc/self/cmdline", "rb").read().rstrip(b"\0").split(b"\0")],
        "main": sys.modules["__main__"].__dict__.get("__file__"), "name": __name__,
    }
    print("probe", json.dumps(info, sort_keys=True), flush=True)
    print("torch_first", torch_first, "draw", numpy.random.randint(1 << 30), flush=True)
    behave(sys.argv[-1] if os.environ["RANK"] == "1" else "exit0")


def nested(n):
    if n == 0:
        raise ValueError("injected failure")
    nested(n - 1)


def behave(how):
    """How rank 1 ends."""
    if how == "exit3":
        sys.exit(3)
    if how == "message":
        sys.exit("goodbye from rank 1")
    if how == "raise":
        nested(2)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "finalize":
        atexit.register(print, "atexit ran", flush=True)
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
        sys.exit(5)


if __name__ == "__main__":
    report(FIRST, TORCH_FIRST, __file__)
'''

# Preloaded beside torch: what a module may do at import that no worker must inherit.
PRELOADED = r'''
import os, signal
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGTERM, lambda *_: None)
os.environ["PROBE_X"] = "set by a preloaded module"
print("printed by a preloaded module", flush=True)
'''

CODE = ("import sys; F, T = sorted(globals()), 'torch' in sys.modules; import probe; "
        "probe.report(F, T)")
MODES = {
    "script": ["probe.py"],
    "module": ["-m", "probe"],
    "code": ["-c", CODE],
    "options": ["-u", "-B", "probe.py"],
}


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "probe_preloaded.py").write_text(PRELOADED)
    return tmp_path


def normalised(text):
    """The driver's output without what differs between any two runs: pids, and the order
    in which the ranks' lines arrived."""
    return sorted(re.sub(r"pid \d+", "pid N", l) for l in text.splitlines())


def run_both(job, cwd, args, timeout=120):
    """The same job without and with --preload (each from `cwd`, which has the probe)."""
    plain = job.run(args, timeout=timeout, cwd=cwd)
    preloaded = job.run(["--preload", "torch,numpy,probe_preloaded", *args], timeout=timeout, cwd=cwd)
    return plain, preloaded


def probes(stdout):
    return {json.loads(l.split("probe ", 1)[1])["env"]["RANK"]: json.loads(l.split("probe ", 1)[1])
            for l in stdout.splitlines() if "<stdout>: probe {" in l}


@needs_torch
@pytest.mark.parametrize("mode", MODES)
def test_a_forked_worker_sees_what_an_exec_d_one_sees(job, probe, mode):
    """Environment (Python's and the C library's), argv, sys.path[0], __main__, the
    interpreter's options, stdin, signal dispositions, its own process group, its command
    line in /proc and torch's thread count (OMP_NUM_THREADS, which OpenMP read in the
    server) are those of a worker without --preload; only torch is already imported."""
    # OMP_NUM_THREADS=3: not torch's default here, nor what OpenMP read in the server.
    args = ["-np", 2, "-x", "PROBE_X=x y", "-x", "OMP_NUM_THREADS=3", PYTHON, *MODES[mode], "exit0"]
    plain, preloaded = run_both(job, probe, args)
    assert plain.returncode == 0, plain.stderr
    assert preloaded.returncode == 0, preloaded.stderr
    want, got = probes(plain.stdout), probes(preloaded.stdout)
    assert sorted(got) == ["0", "1"] and got == want
    assert got["1"]["env"]["RANK"] == got["1"]["c_env"]["RANK"] == "1"
    assert got["0"]["threads"] == 3
    assert normalised(preloaded.stderr) == normalised(plain.stderr)
    assert lines_of(plain.stdout, "torch_first") == ["False", "False"]
    assert lines_of(preloaded.stdout, "torch_first") == ["True", "True"]


def lines_of(stdout, word):
    return sorted(l.split(f"{word} ", 1)[1].split()[0] for l in stdout.splitlines() if f"<stdout>: {word} " in l)


@needs_torch
def test_each_forked_worker_draws_its_own_random_numbers(job, probe):
    """numpy's global generator is seeded when numpy is imported, in the server: each
    worker is reseeded, as a new process would be."""
    r = job.run(["--preload", "torch,numpy", "-np", 2, PYTHON, "probe.py", "exit0"], timeout=120, cwd=probe)
    assert r.returncode == 0, r.stderr
    draws = [l.split("draw ")[1] for l in r.stdout.splitlines() if " draw " in l]
    assert len(draws) == 2 and draws[0] != draws[1], r.stdout


@needs_torch
@pytest.mark.parametrize("how, reported", [
    ("exit3", "exited with code 3"),
    ("message", "exited with code 1"),
    ("raise", "exited with code 1"),
    ("sigkill", r"was killed by signal 9 \(SIGKILL\)"),
    ("interrupt", r"was killed by signal 2 \(SIGINT\)"),
    ("finalize", "exited with code 5"),
])
def test_a_forked_worker_ends_as_an_exec_d_one_does(job, probe, how, reported):
    """Rank 1's exit code or signal, its traceback or message, and what runs at its end
    (atexit, threads) are those without --preload, and the driver reports the same."""
    plain, preloaded = run_both(job, probe, ["-np", 2, PYTHON, "probe.py", how])
    assert plain.returncode == preloaded.returncode != 0
    assert re.search(rf"rank 1 \(host 'localhost', slot 1, pid \d+\) {reported}", preloaded.stderr), preloaded.stderr
    # Rank 0 may be stopped anywhere once rank 1 failed: rank 1's lines are compared.
    of_rank_1 = lambda text: [l for l in normalised(text) if l.startswith(("[1]", "elasticrun: rank 1 "))
                              and " draw " not in l and "torch_first" not in l]
    assert of_rank_1(preloaded.stderr) == of_rank_1(plain.stderr)
    assert of_rank_1(preloaded.stdout) == of_rank_1(plain.stdout)
    if how == "raise":
        # The worker's frames only (<module>, report, behave, nested x 3), none of the server's (<string>).
        assert preloaded.stderr.count('File "') == 6 and '"<string>"' not in preloaded.stderr, preloaded.stderr
    if how == "finalize":
        assert "atexit ran" in preloaded.stdout and "thread finished" in preloaded.stdout


@pytest.mark.parametrize("args", [["missing.py"], ["-c", "import sys; sys.exit(7)"]])
def test_what_the_server_leaves_to_the_interpreter_ends_the_same(job, tmp_path, args):
    """A script that is not there is refused by the server and exec'd (the interpreter
    says why); -c code runs in the server's child. Neither needs torch."""
    plain = job.run(["-np", 1, PYTHON, *args], timeout=60, cwd=tmp_path)
    preloaded = job.run(["--preload", "json", "-np", 1, PYTHON, *args], timeout=60, cwd=tmp_path)
    assert plain.returncode == preloaded.returncode != 0
    assert normalised(preloaded.stderr) == normalised(plain.stderr)
    assert normalised(preloaded.stdout) == normalised(plain.stdout)


@needs_torch
def test_restart_mode_recovers_a_sigkilled_worker_as_without_preload(job, tmp_path):
    """Rank 1 is SIGKILLed mid-training in restart mode: every worker stops, the next
    generation is forked by the same server (torch preloaded), resumes from the
    checkpoint, and ends with the parameters of a run without --preload and without the
    fault."""
    steps = ["--steps", 24, "--step-ms", 60]
    ref = job.run(["-np", 2, PYTHON, DDP, "--checkpoint", tmp_path / "ref.pt", *steps], timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    run = Streamed(job.start(["-np", 2, "--max-restarts", 2, "--preload", "torch,torch.distributed", PYTHON, DDP,
                              "--checkpoint", tmp_path / "ck.pt", *steps, "--print-steps"]))
    run.wait_for(r"ddp: step 8 rank 1 ")
    first = starts("".join(run.out))
    server = parent_of(first[0]["pid"])
    assert b"elasticrund's fork server" in Path(f"/proc/{server}/cmdline").read_bytes()
    os.kill(next(s["pid"] for s in first if s["rank"] == 1), signal.SIGKILL)
    run.wait_for(r"ddp: step \d+ rank 1 restart 1 ")
    second = [s for s in starts("".join(run.out)) if s["restart"] == 1]
    assert second and all(parent_of(s["pid"]) == server for s in second)
    rc, out, err = run.finish()
    assert rc == 0, err[-3000:]
    assert re.search(r"rank 1 \(host 'localhost', slot 1, pid \d+\) was killed by signal 9 \(SIGKILL\); "
                     r"restarting every worker \(restart 1 of 2\)", err), err
    assert len(lines(out, "resumed at step")) == 2
    assert final(out) == pytest.approx(final(ref.stdout), rel=1e-6, abs=1e-6)


def parent_of(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_sigkilled_daemon_leaves_no_worker_and_no_fork_server(job, tmp_path):
    """The daemon dies without a word: its fork server dies with it (PR_SET_PDEATHSIG)
    and the server's workers with the server, at once."""
    p = job.start(["--preload", "json", "-np", 2, PYTHON, "-c",
                   "import os, time; print('up', os.getpid(), flush=True); time.sleep(120)"], cwd=tmp_path)
    run = Streamed(p)
    try:
        deadline = time.monotonic() + 60
        while len(ups := [int(l.split()[-1]) for l in run.out if "<stdout>: up " in l]) < 2:
            assert time.monotonic() < deadline and p.poll() is None, "".join(run.err)
            time.sleep(0.05)
        server = parent_of(ups[0])
        daemon = parent_of(server)
        assert parent_of(ups[1]) == server
        assert b"elasticrund" in Path(f"/proc/{daemon}/cmdline").read_bytes()
        os.kill(daemon, signal.SIGKILL)
        deadline = time.monotonic() + 3
        while set(our_processes(job.tag)) & {server, *ups} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not set(our_processes(job.tag)) & {server, *ups}
    finally:
        p.kill()
        run.finish()


def test_a_fork_server_killed_mid_job_fails_its_workers_and_later_ones_are_exec_d(job, tmp_path):
    """Its workers die with it, reported killed by SIGKILL (nobody can say more); the job
    restarts them (restart mode) by exec, and finishes."""
    code = ("import os, sys, time; restart = os.environ['TORCHELASTIC_RESTART_COUNT']; "
            "print('up', restart, os.getppid(), os.getpid(), flush=True); time.sleep(60 if restart == '0' else 0)")
    run = Streamed(job.start(["--preload", "json", "--max-restarts", 1, "-np", 2, PYTHON, "-c", code], cwd=tmp_path))
    ups = lambda restart: [l.split()[-2:] for l in run.out if f"<stdout>: up {restart} " in l]
    deadline = time.monotonic() + 60
    while len(ups(0)) < 2 and time.monotonic() < deadline and run.proc.poll() is None:
        time.sleep(0.05)
    (server, _), (other, _) = ups(0)
    assert server == other and b"elasticrund's fork server" in Path(f"/proc/{server}/cmdline").read_bytes()
    daemon = parent_of(int(server))
    os.kill(int(server), signal.SIGKILL)
    rc, out, err = run.finish(timeout=60)
    assert rc == 0, err
    assert err.count("fork server of") == 1 and re.search(r"failed: it was killed by signal 9 .*; this job's "
                                                          r"workers start without it", err), err
    assert re.search(r"rank \d \(host 'localhost', slot \d, pid \d+\) was killed by signal 9 \(SIGKILL\); "
                     r"restarting every worker \(restart 1 of 1\)", err), err
    second = ups(1)
    assert len(second) == 2 and all(int(parent) == daemon for parent, _ in second), out  # exec'd by the daemon


def fork_server_of(job):
    """The pid of the job's fork server, or None while there is none."""
    for pid in our_processes(job.tag):
        try:
            if b"elasticrund's fork server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:  # gone meanwhile
            pass
    return None


def test_a_worker_signalled_while_the_server_imports_gets_the_signal_once_forked(job, tmp_path):
    """The driver is interrupted while the fork server still imports (2 s): the daemon's
    SIGTERM to the workers waits for their fork, and they end at once, as workers that
    had just started would, with what they started (their process group: the fixture
    finds any process left)."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(2)\n")
    code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    p = job.start(["--preload", "slow_import", "-np", 2, PYTHON, "-c", code], cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not fork_server_of(job):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    interrupted = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - interrupted < 6, err  # the import's 2 s, then at once
    assert "fork server" not in err, err


def test_a_stopping_job_does_not_wait_for_a_fork_server_still_importing(job, tmp_path):
    """On a listening daemon (systemd's), whose job process outlives its driver unless it
    ends by itself: the driver is stopped while the fork server imports for a minute
    (kReadyLimit allows one). After the stop grace (2 s) the job process gives up the
    workers not forked yet and ends, and its fork server dies with it (the fixture finds
    any process left), instead of staying for the import."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(55)\n")
    daemon = Daemon(tmp_path, job.tag).start()
    try:
        p = job.start([*through(daemon), "--preload", "slow_import", "-np", 2, PYTHON, "-c", "print('never')"],
                      cwd=tmp_path)
        deadline = time.monotonic() + 30
        while not fork_server_of(job):
            assert time.monotonic() < deadline and p.poll() is None, daemon.text()
            time.sleep(0.02)
        job_pid = int(daemon.wait_log(r"started as process (\d+)").group(1))
        interrupted = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert "never" not in out and p.returncode != 0, out + err
        daemon.wait_log(rf"\(process {job_pid}\) ended", timeout=70)
        took = time.monotonic() - interrupted
        assert took < 15, f"the job process waited {took:.1f} s for the import:\n{daemon.text()}"
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0, daemon.text()


def test_stopping_a_job_stops_what_its_forked_workers_started(job, tmp_path):
    """A forked worker leads its own process group, as an exec'd one does: the daemon's
    signals reach what it started (the fixture finds any process left)."""
    code = "import subprocess, time; subprocess.Popen(['sleep', '60']); print('up', flush=True); time.sleep(60)"
    run = Streamed(job.start(["--preload", "json", "-np", 2, PYTHON, "-c", code], cwd=tmp_path))
    deadline = time.monotonic() + 30
    while sum("<stdout>: up" in l for l in run.out) < 2:
        assert time.monotonic() < deadline and run.proc.poll() is None, "".join(run.err)
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGTERM)
    rc, _, err = run.finish(timeout=30)
    assert "interrupted by SIGTERM; stopping all workers" in err, err


@pytest.mark.parametrize("value, bad", [("torch,,x", "an empty name"), ("torch-x", "'torch-x'"), ("", "an empty name"),
                                        ("torch.", "'torch.'"), ("9lives", "'9lives'"), ("a b", "'a b'")])
def test_a_bad_preload_value_is_a_usage_error_naming_it(job, value, bad):
    r = job.run(["--preload", value, "-np", 1, PYTHON, "-c", "pass"], timeout=30)
    assert r.returncode == 2
    assert f"elasticrun: --preload '{value}': {bad} is not a module name" in r.stderr, r.stderr


def test_preload_is_ignored_for_a_command_that_is_no_python_run(job):
    r = job.run(["--preload", "json", "-np", 2, "/bin/echo", "hi"], timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("elasticrun: --preload ignored: '/bin/echo' is not a Python interpreter") == 1, r.stderr
    assert r.stdout.count("hi") == 2


@pytest.mark.parametrize("module, source, why", [
    ("no_such_module_xyz", None, "importing no_such_module_xyz failed: ModuleNotFoundError: No module named "
                                 "'no_such_module_xyz'"),
    ("broken_mod", "raise RuntimeError('broken at import')", "importing broken_mod failed: RuntimeError: broken at "
                                                             "import"),
    ("threaded_mod", "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
     "after importing threaded_mod it runs 2 threads"),
    ("exiting_mod", "import os\nos._exit(4)", "it exited with code 4"),
])
def test_a_fork_server_that_cannot_serve_falls_back_to_exec(job, tmp_path, module, source, why):
    """A module that fails to import, starts a thread or ends the server: said once, and
    the workers start as without --preload, the job's result unchanged."""
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    code = f"import sys; print('{module}' in sys.modules, flush=True)"
    started = time.monotonic()
    r = job.run(["--preload", module, "-np", 2, "-x", f"PYTHONPATH={tmp_path}", PYTHON, "-c", code], timeout=60,
                cwd=tmp_path)
    assert time.monotonic() - started < 30
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("False") == 2, r.stdout
    assert r.stderr.count("fork server of") == 1, r.stderr
    assert re.search(rf"fork server of {PYTHON} \(--preload {module}\) failed: {re.escape(why)}.*; this job's workers "
                     r"start without it", r.stderr), r.stderr


STORE_PROBE = r'''
import os, sys
env = os.environ
port = int(env["MASTER_PORT"])


def listening():
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


restart, rank = env["TORCHELASTIC_RESTART_COUNT"], env["RANK"]
print("store", restart, rank, env["TORCHELASTIC_USE_AGENT_STORE"], listening(), flush=True)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (int(rank) + 1)
dist.all_reduce(t)
print("sum", restart, rank, t.item(), flush=True)
dist.destroy_process_group()
if restart == "0" and rank == "1":
    sys.exit(1)
'''


@needs_torch
def test_restart_mode_hosts_torchs_store_before_the_workers_start(job, tmp_path):
    """Restart mode with --preload, as torchrun's agent: from the second generation on (its
    fork server runs by then) rank 0's daemon starts torch's TCPStore on MASTER_PORT as a
    fork of the server, and answers the reservation once it listens. So every worker of
    that generation finds the store up at its start (no connection refused, no second of
    retry) and gets TORCHELASTIC_USE_AGENT_STORE=True; init_process_group and a collective
    work; the store's process ends with the job (the fixture finds any process left). The
    first generation (no server yet when its port is reserved) has rank 0 host it."""
    ev = tmp_path / "events"
    r = job.run(["--preload", "torch,torch.distributed", "--max-restarts", 1, "--events", ev, "-np", 2, PYTHON,
                 "-c", STORE_PROBE], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = {tuple(l.split("store ", 1)[1].split()) for l in r.stdout.splitlines() if "<stdout>: store " in l}
    assert {(rank, agent) for restart, rank, agent, _ in seen if restart == "0"} == {("0", "False"), ("1", "False")}
    assert {s for s in seen if s[0] == "1"} == {("1", "0", "True", "True"), ("1", "1", "True", "True")}, seen
    sums = sorted(l.split("sum ", 1)[1] for l in r.stdout.splitlines() if "<stdout>: sum " in l)
    assert sums == ["0 0 3.0", "0 1 3.0", "1 0 3.0", "1 1 3.0"], r.stdout[-3000:]
    ports = [e for e in job.events(ev) if e["event"] == "port_reserved"]
    assert [e["store"] for e in ports] == [False, True], ports


def stat_fields(pid):
    """A process's state and what follows it in /proc/PID/stat (["gone"] once reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return ["gone"]


def test_a_daemon_stopped_while_its_fork_server_imports_is_a_lost_host(job, tmp_path):
    """One host's daemon is stopped (SIGTERM: `systemctl restart`, a preempted machine)
    while its fork server still imports. The workers it had not forked yet are given up
    after the grace, which is the host's loss, not a program that cannot start: the
    elastic job goes on with the other host. It used to end at once with "cannot start
    rank N ... stopped before it started" (exit 3)."""
    flag = tmp_path / "importing"
    flag.touch()
    (tmp_path / "gated_import.py").write_text(
        f"import os, time\nwhile os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n")
    p = job.start(["--preload", "gated_import", "-np", 2, "--min-np", 1, "-H", "localhost:1,127.0.0.2:1",
                   PYTHON, "-c", "print('worker ran')"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        servers = []
        while len(servers) < 2:
            assert time.monotonic() < deadline and p.poll() is None, "two fork servers did not start"
            servers = [pid for pid in our_processes(job.tag)
                       if b"elasticrund's fork server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
            time.sleep(0.05)
        daemon = int(stat_fields(servers[0])[1])  # its parent
        assert b"elasticrund" in Path(f"/proc/{daemon}/cmdline").read_bytes()
        os.kill(daemon, signal.SIGTERM)
        deadline = time.monotonic() + 15  # the daemon's grace is 2 s
        while stat_fields(daemon)[0] not in ("Z", "gone"):
            assert time.monotonic() < deadline, "the stopped daemon did not end"
            time.sleep(0.05)
        time.sleep(0.5)  # the driver hears of its end
    finally:
        flag.unlink()
    out, err = p.communicate(timeout=60)
    assert "cannot start rank" not in err, err
    assert p.returncode == 0, out + err
    assert "worker ran" in out, out + err
