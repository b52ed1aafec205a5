"""elasticrun's numpy-level API against single-process references, under the real
launcher: every collective for every dtype and op, in place and out of place, async
handles and their order, prescale/postscale, and the errors (wrong dtype, non-contiguous
or read-only buffers, shapes that differ across ranks, a call before init)."""
import re

import pytest

from conftest import HERE, run_python

WORKER = HERE / "workers" / "core_checks.py"
# One host (the shared-memory path) and two hosts (UCX between them).
LAYOUTS = {"one-host": ["-np", 2], "two-hosts": ["-np", 3, "-H", "localhost:2,127.0.0.2:1"]}
# At least this many checks per rank, so that a mode that stopped checking fails.
MODES = {"collectives": 400, "scaling": 8, "order": 100, "errors": 15, "before_init": 3, "dlpack": 28,
         "reinit": 18}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_mode(job, layout, mode):
    args = LAYOUTS[layout]
    r = run_python(job, args, WORKER, mode, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    counts = [int(n) for n in re.findall(rf"core_checks {mode}: OK (\d+) checks", r.stdout)]
    assert len(counts) == args[1], r.stdout[-3000:]
    assert min(counts) >= MODES[mode], counts


EXIT_WORKER = """
import time
import numpy
import elasticrun as er
er.init()
if er.rank() == 0:
    x = numpy.ones(100000, dtype=numpy.float32)
    h = er.allreduce_async(x, out=x)  # the other rank never issues it: it waits when the program ends
    raise RuntimeError("rank 0 gives up with a collective pending")
time.sleep(3)
"""


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_program_that_ends_with_a_collective_pending_exits_with_its_code(job, tmp_path, layout):
    """Rank 0 raises while its async allreduce waits for a rank that never issues it, and
    never calls shutdown(): it must end with Python's exit code 1, not crash (the engine's
    thread kept waiting while the library's context was torn down: SIGSEGV)."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_WORKER)
    r = run_python(job, LAYOUTS[layout], script, timeout=60)
    assert "rank 0 (host" in r.stderr and "exited with code 1" in r.stderr, r.stderr[-3000:]
    assert "signal" not in r.stderr and "Segmentation" not in r.stderr, r.stderr[-3000:]


SHUTDOWN_WORKER = """
import sys, time
import numpy
import elasticrun as er
er.init()
er.barrier()  # connected
if er.rank() == 0:
    x = numpy.ones(1000, dtype=numpy.float32)
    er.allreduce_async(x, out=x)  # dropped at once; no other rank ever issues it
    kept = er.allreduce_async(numpy.ones(8, dtype=numpy.float32))  # queued behind it, handle kept
    start = time.monotonic()
    er.shutdown()
    print("shutdown took %.1f s" % (time.monotonic() - start), flush=True)
    try:
        kept.wait()
        print("the kept handle completed", flush=True)
    except er.ElasticrunError as e:
        print("the kept handle: %s" % e, flush=True)
else:
    time.sleep(16)  # alive, and never issuing rank 0's collectives
    er.shutdown()
"""


def test_shutdown_abandons_collectives_no_peer_issues(job, tmp_path):
    """Rank 0 drops an async allreduce that the other rank (alive for 16 s) never issues
    and queues another behind it, then calls shutdown(): it waits out its grace (10 s),
    abandons both with a warning and returns, long before the collective timeout (120 s
    here); the kept handle's wait then raises instead of hanging, and the job ends 0."""
    script = tmp_path / "shutdown.py"
    script.write_text(SHUTDOWN_WORKER)
    r = run_python(job, ["-np", 2], script, timeout=100, env={"ELASTICRUN_COLLECTIVE_TIMEOUT": "120"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    took = float(re.search(r"shutdown took ([\d.]+) s", r.stdout).group(1))
    assert 9.5 <= took < 15, r.stdout
    assert "still pending after 10 s: abandoned" in r.stderr, r.stderr[-3000:]
    assert re.search(r"the kept handle: .*shutdown\(\) abandoned the collective", r.stdout), r.stdout[-3000:]
