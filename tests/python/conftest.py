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

job = integration.job
BUILD = integration.BUILD
ROOT = integration.ROOT
ELASTICRUN = integration.ELASTICRUN
our_processes = integration.our_processes
PYTHON = "/usr/bin/python3"
PYTHONPATH = str(BUILD / "python")
HERE = Path(__file__).resolve().parent


def python_env(extra=None):
    """The environment a worker needs to import the package as built."""
    env = {"PYTHONPATH": PYTHONPATH + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    env.update(extra or {})
    return env


def run_python(job, np_args, script, *args, timeout=120, env=None):
    """Runs `script` (a path) as every worker of `elasticrun <np_args>` and returns the
    CompletedProcess; PYTHONPATH carried to the workers with -x."""
    return job.run(["-x", "PYTHONPATH", *np_args, PYTHON, script, *args], timeout=timeout, env=python_env(env))
