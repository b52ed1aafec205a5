"""Tests of the Python package (python/): real workers under the real elasticrun, with
the integration suite's fixtures (the `job` fixture's orphan and /dev/shm checks).

Workers run Debian's /usr/bin/python3 (the interpreter with python3-torch), named by
path: another python3 earlier on PATH may have no torch."""
import importlib.util
import os
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("integration_conftest",
                                               Path(__file__).resolve().parents[1] / "integration" / "conftest.py")
integration = importlib.util.module_from_spec(_spec)
sys.modules["integration_conftest"] = integration
_spec.loader.exec_module(integration)

_spec = importlib.util.spec_from_file_location("invariant", Path(__file__).resolve().parents[1] / "integration" /
                                               "invariant.py")
_invariant = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_invariant)
check_commits = _invariant.check_commits

job = integration.job
BUILD = integration.BUILD
ROOT = integration.ROOT
ELASTICRUN = integration.ELASTICRUN
our_processes = integration.our_processes
discovery_script = integration.discovery_script
checkpoints = integration.checkpoints
wait_for_checkpoints = integration.wait_for_checkpoints
PYTHON = "/usr/bin/python3"
PYTHONPATH = str(BUILD / "python")
HERE = Path(__file__).resolve().parent


def python_env(extra=None):
    """The environment a worker needs to import the package as built."""
    env = {"PYTHONPATH": PYTHONPATH + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    env.update(extra or {})
    return env


def run_python(job, np_args, script, *args, timeout=120, env=None, **kw):
    """Runs `script` (a path) as every worker of `elasticrun <np_args>` and returns the
    CompletedProcess; PYTHONPATH carried to the workers with -x. `kw` goes to
    subprocess.run (pass_fds, say)."""
    return job.run(["-x", "PYTHONPATH", *np_args, PYTHON, script, *args], timeout=timeout, env=python_env(env),
                   **kw)


def start_python(job, np_args, script, *args, env=None):
    """As run_python, started: returns the Popen."""
    return job.start(["-x", "PYTHONPATH", *np_args, PYTHON, script, *args], env=python_env(env))


def workers_of(job, script_name, n, timeout=30):
    """Pids of the job's `n` python workers running `script_name`, by host."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for pid in our_processes(job.tag):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                env = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if cmd[0].endswith(b"python3") and any(c.endswith(script_name.encode()) for c in cmd):
                found[env.split(b"ELASTICRUN_HOST=")[1].split(b"\0")[0].decode()] = pid
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{n} workers of {script_name} did not start")
