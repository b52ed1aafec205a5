"""A short chaos soak (scripts/chaos): random SIGKILLs and SIGSTOPs of workers, killed
daemons, the loss of every worker at once and a flapping discovery file, then the
script's own checks (exit 0, the reference model for the steps done, nothing left
behind). The long soak's figures are in bench/RESULTS.md."""
import re
import subprocess

from conftest import BUILD, ROOT


def test_short_chaos_soak_keeps_every_guarantee(tmp_path):
    r = subprocess.run([str(ROOT / "scripts" / "chaos"), "--faults", "25", "--seed", "11", "--build", str(BUILD),
                        "--keep", str(tmp_path / "run")], capture_output=True, text=True, timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "FAILED" not in out, out[-4000:]
    assert len(re.findall(r"^chaos: ok ", out, re.M)) == 4, out[-4000:]
    counts = dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", out.split("chaos: faults: ")[1].splitlines()[0]))
    assert sum(counts[k] for k in ("sigkill", "sigstop", "daemon", "total", "flap")) == 25, counts
    for kind in ("sigkill", "sigstop", "daemon", "total", "flap"):  # the seed strikes each kind
        assert counts[kind] >= 1, (kind, counts)
    assert re.search(r"from a checkpoint [1-9]", out), out[-2000:]
