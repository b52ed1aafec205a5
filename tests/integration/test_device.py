"""The GPU check's workers on this machine: examples/device_elastic_check,
examples/device_collective_check and bench/device_allreduce_bench. Without a GPU the
elastic check runs on host buffers (--memory host): the same steps, failure modes and
commit arithmetic that scripts/gpu-check drives on a GPU, through the real launcher and
real signals. Built only with the NCCL backend (CUDA and NCCL found at configure time)."""
import os
import shutil
import subprocess

import pytest

from conftest import BUILD, EXAMPLES, ROOT, requires

ELASTIC = EXAMPLES / "device_elastic_check"
CHECK = EXAMPLES / "device_collective_check"
BENCH = BUILD / "bench" / "device_allreduce_bench"
needs_dev = requires("gpu", not ELASTIC.exists(), "built without the NCCL backend")  # fails with ELASTICRUN_TEST_REQUIRE=gpu
GPU_CHECK = ROOT / "scripts" / "gpu-check"
HOSTS3 = "localhost:1,127.0.0.2:1,127.0.0.3:1"


def finals(out):
    return sorted(l.split(": final ", 1)[1] for l in out.splitlines() if ": final steps=" in l)


@needs_dev
@pytest.mark.parametrize("where,how", [("device", "kill"), ("host", "exit"), ("device", "stop")])
def test_elastic_survivors_finish_with_the_right_total(job, where, how):
    # Rank 2 of the first epoch fails at step 35 (SIGKILL, exit 1 or SIGSTOP), between the
    # commits of steps 30 and 40; its host is blacklisted and the two survivors restore
    # their last commit and finish: each step is counted once, so total == steps. The
    # survivors had counted step 36 as begun in tracked state before the failure hit its
    # allreduce, so without the rollback their state totals would end at 101.
    args = ["-np", 3, "--min-np", 2, "-H", HOSTS3, "--elastic-timeout", 30]
    env = None
    if how == "stop":  # found by the peers' collective timeout, then the join deadline
        args += ["--rendezvous-timeout", 5]
        env = {"ELASTICRUN_COLLECTIVE_TIMEOUT": "2"}
    r = job.run([*args, ELASTIC, "--memory", "host", "--steps", 100, "--fail-at-step", 35,
                 "--fail-where", where, "--fail-how", how], timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"rank 2: failing at step 35 ({how}, before the {where} allreduce)" in r.stdout, r.stdout
    got = finals(r.stdout)
    assert len(got) == 2 and all(l.startswith("steps=100 total=100 state totals=100,100 ") and l.endswith(" OK")
                                 for l in got), got
    assert "blacklisting host '127.0.0.3'" in r.stderr, r.stderr


@needs_dev
@pytest.mark.parametrize("prog,args,message", [
    (ELASTIC, ["--bogus"], "device_elastic_check: unknown argument '--bogus'"),
    (ELASTIC, ["--steps", "-3"], "--steps '-3' is not a non-negative integer"),
    (ELASTIC, ["--steps"], "--steps needs a value"),
    (ELASTIC, ["--fail-how", "nap"], "--fail-how 'nap': want exit, kill or stop"),
    (ELASTIC, ["--fail-where"], "--fail-where '': want host or device"),
    (ELASTIC, ["--memory", "disk"], "--memory 'disk': want host or device"),
    (CHECK, ["--memory", "host"], "device_collective_check: unknown argument '--memory'"),
    (BENCH, ["--min-bytes", "64", "--max-bytes", "8"], "device_allreduce_bench: want 4 <= --min-bytes <= --max-bytes"),
    (BENCH, ["--steps", "3"], "device_allreduce_bench: unknown argument '--steps'"),
], ids=lambda v: v.name if hasattr(v, "name") else None)
def test_bad_arguments_exit_2_with_a_message(prog, args, message):
    r = subprocess.run([str(prog), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr, r.stderr


@needs_dev
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
@pytest.mark.parametrize("prog", [CHECK, BENCH, ELASTIC], ids=lambda p: p.name)
def test_without_a_gpu_the_device_programs_say_why_and_exit_77(job, prog):
    r = job.run(["-np", 1, prog], timeout=60)
    assert f"{prog.name}: " in r.stderr and ("no CUDA device" in r.stderr or "without" in r.stderr), r.stderr
    assert "exited with code 77" in r.stderr, r.stderr


def test_gpu_check_selftest():
    # Its log parsing and budgeting, and the bundle it packs for a GPU machine: every
    # library a packed binary loads is packed too (or is glibc's, the driver's or NCCL).
    r = subprocess.run([str(GPU_CHECK), "--selftest"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu-check selftest: OK" in r.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
def test_gpu_check_without_a_gpu_exits_77(tmp_path):
    env = dict(os.environ, GPU_CHECK_LOG=str(tmp_path / "log"))
    r = subprocess.run([str(GPU_CHECK)], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 77, r.stdout + r.stderr
    assert "no NVIDIA GPU visible" in r.stdout
    r = subprocess.run([str(GPU_CHECK), "--frobnicate"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "usage: scripts/gpu-check" in r.stderr, r.stdout + r.stderr
