"""shutdown() and init() again in one process, as Horovod's test suite does between its
tests: every cycle's collectives work, on one host (shared memory) and across two (UCX).
A new incarnation joins the same epoch with a key-value scope of its own, so it never
connects to the address or the shared segment its peers' previous incarnations published
(that failed by the third cycle: "connecting to rank 0: Shared memory error")."""
import pytest

from conftest import TESTPROG

CYCLES = 8


@pytest.mark.parametrize("layout", [["-np", 2], ["-np", 3, "-H", "localhost:2,127.0.0.2:1"]],
                         ids=["one-host", "two-hosts"])
def test_shutdown_then_init_again(job, layout):
    r = job.run([*layout, TESTPROG, "--reinit", CYCLES])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for cycle in range(CYCLES):
        for rank in range(layout[1]):
            assert f"reinit cycle {cycle} rank {rank} ok" in r.stdout, (cycle, rank, r.stdout[-3000:])
