"""scripts/bench-cluster refuses bad arguments with their reason and exit status 2, before it
builds anything or brings a cluster up (its figures belong to bench/RESULTS.md, not to a
test); so does the collective sweep's benchmark, before it starts the library."""
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

BENCH = ROOT / "scripts" / "bench-cluster"


@pytest.mark.parametrize("args, says", [
    (["allreduce", "--also", "FOO"], "--also 'FOO': expected VAR=VALUE"),
    (["allreduce", "--also", "A B=1"], "--also 'A B=1': expected VAR=VALUE"),
    (["allreduce", "--also", "=1"], "--also '=1': expected VAR=VALUE"),
    (["allreduce", "--per-host", "0"], "--per-host must be at least 1"),
    (["allreduce", "--layout", "2,x"], "--layout '2,x': expected ranks per host, comma-separated"),
    (["allreduce", "--layout", "2,0,1"], "--layout '2,0,1': 1 to 8 hosts of at least 1 rank each"),
    (["allreduce", "--layout", "1,1,1,1,1,1,1,1,1"], "1 to 8 hosts of at least 1 rank each"),
    (["recovery", "--recovery-hosts", "9"], "--recovery-hosts 9: expected 3 to 8"),
    (["recovery", "--host-timeouts", "ten"], "--host-timeouts 'ten': expected numbers of seconds"),
    (["bandwidth"], "unknown benchmark 'bandwidth'"),
])
def test_bad_arguments_are_refused_with_their_reason(args, says):
    r = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert says in r.stderr, r.stderr
    assert "cluster up" not in r.stderr and not r.stdout, (r.stdout, r.stderr)


@pytest.mark.parametrize("args, says", [
    (["--warmup", "-1"], "--warmup: expected a whole number >= 0, got '-1'"),
    (["--warmup", "many"], "--warmup: expected a whole number >= 0, got 'many'"),
    (["--iters", "0"], "--iters: expected a whole number >= 1, got '0'"),
    (["--batch", "2x"], "--batch: expected a whole number >= 0, got '2x'"),
    (["--collective", "gather"], "--collective: unknown collective 'gather'"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "need --step >= 2 and --min-bytes <= --max-bytes"),
    (["--bogus"], "--bogus: unknown flag"),
])
def test_the_sweep_benchmark_refuses_bad_flags_with_their_reason(args, says):
    """bench/allreduce_bench (its flags are bench/sweep.cc's, which the Open MPI and Gloo
    benchmarks share) exits 2 with the flag and the reason, before it starts the library."""
    r = subprocess.run([str(BUILD / "bench" / "allreduce_bench"), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert says in r.stderr and not r.stdout, (r.stdout, r.stderr)
