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
