"""examples/python/digits_elastic.py, the Horovod-idiom example, under a real fault and a
resize: a worker is SIGKILLed mid-training and a host is added by discovery. The job must
succeed with every final rank holding the same model (checksum) at >= 95% held-out
accuracy, and the resets must have happened."""
import json
import os
import re
import signal
import time

from conftest import ROOT, discovery_script, start_python, workers_of

EXAMPLE = ROOT / "examples" / "python" / "digits_elastic.py"


def wait_joined(events, epoch, timeout=60):
    """Waits until every worker of `epoch` has joined it (its epoch_joined event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(json.loads(l).get("event") == "epoch_joined" and json.loads(l).get("epoch") == epoch
                   for l in events.read_text().splitlines() if l.strip()):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"epoch {epoch} was not joined within {timeout} s")


def finals(out):
    return re.findall(r"final: held-out accuracy ([0-9.]+) on \d+ images, model checksum (\S+)", out)


def test_digits_survives_a_kill_and_a_new_host(job, tmp_path):
    hosts, script = discovery_script(tmp_path, ["localhost:1", "127.0.0.2:1", "127.0.0.3:1"])
    events = tmp_path / "events"
    p = start_python(job, ["--min-np", 1, "--host-discovery-script", script, "--discovery-interval", 0.1,
                           "--events", events], EXAMPLE, "--epochs", 20, "--batch-ms", 1)
    by_host = workers_of(job, "digits_elastic.py", 3)
    wait_joined(events, 1)  # training under way, not still importing torch
    time.sleep(0.5)
    os.kill(by_host["127.0.0.2"], signal.SIGKILL)
    wait_joined(events, 2)
    hosts.write_text("localhost:1\n127.0.0.3:1\n127.0.0.4:2\n")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    got = finals(out)
    assert len(got) == 4, out[-3000:]  # localhost, 127.0.0.3 and two on 127.0.0.4
    assert all(float(acc) >= 0.95 for acc, _ in got), got
    assert len({c for _, c in got}) == 1, got  # one model on every rank
    resets = re.findall(r"reset: size (\d+) rank 0", out)
    assert "2" in resets and "4" in resets, out[-3000:]
