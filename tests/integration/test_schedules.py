"""The shipped discovery scripts drive real elastic jobs: each resizing schedule, run by
scripts/schedule, must end with every surviving worker holding the reference model."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BUILD, EXAMPLES, ROOT, our_processes
from test_sgd import finals, reference


@pytest.mark.parametrize("name,env", [
    ("8gpu_60_1", {"STEPS": "80", "ER_PERIOD": "1", "STEP_MS": "30"}),
    ("8gpu_exp", {"STEPS": "90", "STEP_MS": "30"}),
])
def test_schedule_keeps_the_invariant(job, name, env):
    r = subprocess.run([str(ROOT / "scripts" / "schedule"), name], capture_output=True, text=True, timeout=240,
                       env=job.env({"BUILD": str(BUILD), **env}))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"schedule {name}: OK" in r.stdout
    sizes = [int(m) for m in re.findall(r"epoch +\d+ +(\d+) workers", r.stdout)]
    if name == "8gpu_exp":
        assert sizes[0] == 2 and max(sizes) > 2, r.stdout  # grew as training progressed
    else:
        assert sizes[0] == 8 and len(sizes) >= 2, r.stdout  # resized at least once


def test_c_api_elastic_program_survives_a_failure(job):
    sgd_c = EXAMPLES / "elastic_sgd_c"
    if not sgd_c.exists():
        pytest.skip("elastic_sgd_c not built")
    args = ["--steps", 2000, "--dim", 1500, "--batch", 256, "--commit-every", 10]
    p = job.start(["-np", 3, "--min-np", 2, "-H", "localhost:1,127.0.0.2:1,127.0.0.3:1", sgd_c, *args])
    deadline = time.monotonic() + 20
    victim = None
    while victim is None and time.monotonic() < deadline:
        for pid in our_processes(job.tag):
            try:
                env = open(f"/proc/{pid}/environ", "rb").read()
                argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
            except OSError:
                continue
            if argv0.endswith(b"elastic_sgd_c") and b"ELASTICRUN_HOST=127.0.0.2" in env:
                victim = pid
        time.sleep(0.05)
    assert victim, "no worker on 127.0.0.2"
    # Kill it once training is under way (a commit reported), so that the survivors roll
    # back work done since that commit; killed before the first step, a State whose
    # restore did nothing went unnoticed.
    head = []
    for line in p.stdout:
        head.append(line)
        if "committed step" in line and int(line.split("committed step ")[1].split()[0]) >= 20:
            break
    assert any("committed step" in l for l in head), "".join(head)[-3000:]
    os.kill(victim, signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    out = "".join(head) + out
    assert p.returncode == 0, err[-3000:]
    got = finals(out)
    assert len(got) == 2 and all(g == reference(args) for g in got), (got, reference(args))
    assert "reset: size 2" in out, out[-3000:]
    # The C API has no epoch to print: rank 0's commits never go back (see check_commits).
    steps = [int(s) for s in re.findall(r"committed step (\d+) size", out)]
    assert steps[-1] == 2000 and all(b >= a for a, b in zip(steps, steps[1:])), steps
