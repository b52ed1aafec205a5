"""Shared fixtures: paths to the real binaries, and a check that no test leaves a process behind.

Skips that CI can forbid. A test that cannot run here for want of something skips with the
reason: network namespaces ("netns": the test cluster of scripts/testcluster needs root,
iproute2 and sshd), a GPU ("gpu": the device tests need the NCCL backend built). With
ELASTICRUN_TEST_REQUIRE naming it (comma-separated: ELASTICRUN_TEST_REQUIRE=netns,gpu) such
a skip fails the test instead, with the same reason, so a machine that should run those
tests cannot pass without running them. A name this list does not know is a usage error.
The GoogleTest suites read the same variable (tests/require.h). Use skip_unless_required()
in a test or fixture, or the requires() marker.
"""
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("ELASTICRUN_BUILD", ROOT / "build"))
ELASTICRUN = BUILD / "cmd" / "elasticrun"
ELASTICRUND = BUILD / "daemon" / "elasticrund"
TESTPROG = BUILD / "tests" / "testprog"
EXAMPLES = BUILD / "examples"

REQUIRE_VAR = "ELASTICRUN_TEST_REQUIRE"
REQUIREMENTS = ("netns", "gpu", "multigpu")  # as in tests/require.h; multigpu: only the GoogleTest suites use it


def required_now():
    return {w.strip() for w in os.environ.get(REQUIRE_VAR, "").split(",") if w.strip()}


def skip_unless_required(what, reason):
    """Skips the test with `reason`, or fails it with that reason when ELASTICRUN_TEST_REQUIRE
    names `what`."""
    assert what in REQUIREMENTS, what
    if what in required_now():
        pytest.fail(f"{reason} ({REQUIRE_VAR}={os.environ[REQUIRE_VAR]} requires {what}, so this does not skip)",
                    pytrace=False)
    pytest.skip(reason)


def requires(what, missing, reason):
    """A marker: when `missing` is true the test skips with `reason`, or fails (see
    skip_unless_required)."""
    assert what in REQUIREMENTS, what
    return pytest.mark.er_requires(what, missing=bool(missing), reason=reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "er_requires(what, missing, reason): skip, or fail when required")
    unknown = sorted(required_now() - set(REQUIREMENTS))
    if unknown:
        raise pytest.UsageError(f"{REQUIRE_VAR}: unknown requirement(s) {', '.join(unknown)}; "
                                f"known: {', '.join(REQUIREMENTS)}")


def pytest_runtest_setup(item):
    for m in item.iter_markers("er_requires"):
        if m.kwargs["missing"]:
            skip_unless_required(m.args[0], m.kwargs["reason"])


def our_processes(marker):
    """Pids of live (non-zombie) processes whose command line or environment mentions `marker`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            stat = (d / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            blob = (d / "cmdline").read_bytes() + (d / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(d.name))
    return found


def gone_within(job, pid, timeout=5):
    """Whether the job's process `pid` has ended (or is a zombie) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while pid in our_processes(job.tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid not in our_processes(job.tag)


class Job:
    """One run of elasticrun with a unique tag in its environment, so that every process
    it starts (daemons, workers, their children) can be found afterwards."""

    def __init__(self, tag):
        self.tag = tag

    def env(self, extra=None):
        env = dict(os.environ)
        env["ER_TEST_TAG"] = self.tag
        env.setdefault("ELASTICRUN_COLLECTIVE_TIMEOUT", "60")
        if extra:
            env.update(extra)
        return env

    def run(self, args, timeout=60, env=None, **kw):
        return subprocess.run([str(ELASTICRUN), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=self.env(env), **kw)

    def events(self, path):
        """The --events log as a list of dicts."""
        import json
        try:
            return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
        except FileNotFoundError:
            return []

    def start(self, args, env=None, **kw):
        return subprocess.Popen([str(ELASTICRUN), *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env(env), **kw)


def run_testcluster(*args, timeout=60):
    """scripts/testcluster ARGS..., its output captured."""
    return subprocess.run([str(ROOT / "scripts" / "testcluster"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def shape_link(k, *args):
    """`testcluster link K shape ARGS...` (none: unshaped), which must succeed."""
    r = run_testcluster("link", k, "shape", *args)
    assert r.returncode == 0, r.stderr
    return r


def cluster_addr(k):
    """Host K's address in the namespace cluster."""
    return f"{os.environ.get('TESTCLUSTER_NET', '10.77.0')}.{10 + k}"


def namespace_cluster(hosts, slots, *shape):
    """Generator for a module fixture: `scripts/testcluster up` (with the SHAPE options
    `shape`; skipping the module where namespaces cannot be made, failing it when
    ELASTICRUN_TEST_REQUIRE has netns), yields (cluster directory, the env file's
    variables), then `down`."""
    import re
    script = ROOT / "scripts" / "testcluster"
    r = subprocess.run([str(script), "up", str(hosts), "--slots", str(slots), *shape], capture_output=True, text=True,
                       timeout=120)
    if r.returncode == 77:
        skip_unless_required("netns", "network namespaces unavailable: " +
                             (r.stderr.strip().splitlines() or ["testcluster: exit 77"])[-1])
    assert r.returncode == 0, r.stderr
    directory = Path(re.search(r"CLUSTER_DIR=(\S+)", r.stdout).group(1))
    env = {}
    for line in (directory / "env").read_text().splitlines():
        m = re.match(r"export (\w+)=\"?([^\"]*)\"?$", line)
        if m:
            env[m.group(1)] = m.group(2)
    yield directory, env
    subprocess.run([str(script), "down"], capture_output=True, timeout=120)


def checkpoints(d):
    """The durable checkpoint files in `d` (--checkpoint-dir), oldest first; none while
    the driver has not made the directory yet."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith("commit-")) if d.exists() else []


def wait_for_checkpoints(d, n, timeout=60):
    deadline = time.monotonic() + timeout
    while len(checkpoints(d)) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(checkpoints(d)) >= n, f"no {n} checkpoints in {d} within {timeout} s: {checkpoints(d)}"


def wait_for_progress(progress, step, p=None, timeout=60):
    """Waits until a --progress-file (examples/elastic_sgd's, rank 0's last committed step)
    reaches `step`; fails early if the job `p` ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if int(progress.read_text().strip() or 0) >= step:
                return
        except (FileNotFoundError, ValueError):
            pass
        assert p is None or p.poll() is None, "the job ended early: " + p.stderr.read()[-3000:]
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def discovery_script(tmp_path, lines):
    """A --host-discovery-script that prints the file it returns (one host a line), which
    the test rewrites to add and remove hosts."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(line + "\n" for line in lines))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    return hosts, script


def shm_entries():
    try:
        return {e.name for e in os.scandir("/dev/shm") if e.name.startswith(("ucx", "elasticrun.", "elasticrun-coll."))}
    except OSError:
        return set()


def someone_elses(entry, tag):
    """True when a /dev/shm entry belongs to a live process that is not this job's: the
    daemons' directories are elasticrun.<daemon pid>.…, the library's segments
    elasticrun-coll.<pid>.…. Another test or suite running beside this one makes such
    entries; a dead owner's entry is a leak whoever it was, and is reported."""
    parts = entry.split(".")
    if not entry.startswith(("elasticrun.", "elasticrun-coll.")) or len(parts) < 2 or not parts[1].isdigit():
        return False
    try:
        blob = Path(f"/proc/{parts[1]}/environ").read_bytes() + Path(f"/proc/{parts[1]}/cmdline").read_bytes()
    except OSError:
        return False  # gone: a leak
    return tag.encode() not in blob


@pytest.fixture
def job():
    tag = "er-test-" + uuid.uuid4().hex[:12]
    j = Job(tag)
    shm_before = shm_entries()
    yield j
    # No orphans: everything the job started must be gone shortly after it ended.
    deadline = time.monotonic() + 5
    left = our_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = our_processes(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left behind by the job: {left}"
    # Daemons remove a worker's segments right after reaping it: give them the same bound.
    def ours_leaked():
        return {e for e in shm_entries() - shm_before if not someone_elses(e, tag)}

    leaked = ours_leaked()
    while leaked and time.monotonic() < deadline + 2:
        time.sleep(0.05)
        leaked = ours_leaked()
    assert not leaked, f"shared-memory segments left in /dev/shm: {sorted(leaked)}"
