"""examples/python/digits_elastic.py, the Horovod-idiom example, under a real fault and a
resize: a worker is SIGKILLed (rank 1, or rank 0) or SIGSTOPped mid-training, then a host
is added by discovery. The job must succeed with every final rank holding the same model
(checksum) at >= 95% held-out accuracy, and the resets must have happened."""
import json
import os
import re
import signal
import time

import pytest

from conftest import ROOT, discovery_script, start_python, workers_of

EXAMPLE = ROOT / "examples" / "python" / "digits_elastic.py"


def wait_joined(events, epoch, timeout=60):
    """Waits until every worker of `epoch`, or of a later one, has joined it (an
    epoch_joined event): a stopped worker's epochs are abandoned until it is failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(json.loads(l).get("event") == "epoch_joined" and json.loads(l).get("epoch", 0) >= epoch
                   for l in events.read_text().splitlines() if l.strip()):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"epoch {epoch} was not joined within {timeout} s")


def finals(out):
    return re.findall(r"final: held-out accuracy ([0-9.]+) on \d+ images, model checksum (\S+)", out)


@pytest.mark.parametrize("victim,sig", [("127.0.0.2", signal.SIGKILL), ("localhost", signal.SIGKILL),
                                        ("127.0.0.2", signal.SIGSTOP)],
                         ids=["kill-rank1", "kill-rank0", "stop-rank1"])
def test_digits_survives_a_fault_and_a_new_host(job, tmp_path, victim, sig):
    """A stopped worker is noticed by the survivors' collective timeout (2 s here), then
    failed by the driver when it does not join the next epoch (--rendezvous-timeout)."""
    hosts, script = discovery_script(tmp_path, ["localhost:1", "127.0.0.2:1", "127.0.0.3:1"])
    events = tmp_path / "events"
    p = start_python(job, ["--min-np", 1, "--host-discovery-script", script, "--discovery-interval", 0.1,
                           "--rendezvous-timeout", 2, "--events", events], EXAMPLE, "--epochs", 20, "--batch-ms", 1,
                     env={"ELASTICRUN_COLLECTIVE_TIMEOUT": "2"})
    by_host = workers_of(job, "digits_elastic.py", 3)
    wait_joined(events, 1)  # training under way, not still importing torch
    time.sleep(0.5)
    os.kill(by_host[victim], sig)
    wait_joined(events, 2)
    survivors = [h for h in ("localhost", "127.0.0.2", "127.0.0.3") if h != victim]
    hosts.write_text("".join(f"{h}:1\n" for h in survivors) + "127.0.0.4:2\n")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    got = finals(out)
    assert len(got) == 4, out[-3000:]  # two survivors and two on 127.0.0.4
    assert all(float(acc) >= 0.95 for acc, _ in got), got
    assert len({c for _, c in got}) == 1, got  # one model on every rank
    resets = re.findall(r"reset: size (\d+) rank 0", out)
    assert "2" in resets and "4" in resets, out[-3000:]
    exited = [json.loads(l) for l in events.read_text().splitlines() if '"worker_exited"' in l]
    assert any(e["host"] == victim for e in exited), exited  # the fault hit the worker meant
