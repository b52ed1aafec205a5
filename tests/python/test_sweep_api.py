"""elasticrun.report, should_stop and elasticrun.sweep in Python workers under the real
launcher, with the test answering reports on --report-fd."""
import json
import re
import socket
import threading

from conftest import HERE, run_python

WORKER = HERE / "workers" / "report_worker.py"


def answer_reports(sock, stop_at, seen):
    f = sock.makefile("rwb", buffering=0)
    for line in f:
        r = json.loads(line)
        seen.append(r)
        d = "stop" if r["step"] >= stop_at else "continue"
        f.write(json.dumps({"step": r["step"], "decision": d}).encode() + b"\n")
    sock.close()


def test_report_returns_the_same_decision_on_both_ranks(job, tmp_path):
    ours, theirs = socket.socketpair()
    seen = []
    t = threading.Thread(target=answer_reports, args=(ours, 4, seen), daemon=True)
    t.start()
    config = {"lr": 0.05, "batch": 32}
    try:
        r = run_python(job, ["-np", 2, "--report-fd", theirs.fileno(), "-x", "ELASTICRUN_TRIAL_CONFIG",
                             "-x", "ELASTICRUN_TRIAL_ID=t7", "-x", f"ELASTICRUN_TRIAL_DIR={tmp_path}"],
                       WORKER, 50, pass_fds=[theirs.fileno()], env={"ELASTICRUN_TRIAL_CONFIG": json.dumps(config)})
    finally:
        theirs.close()
        t.join(timeout=10)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in (0, 1):
        decisions = re.findall(rf"rank {rank} step (\d+) -> (\w+)", r.stdout)
        assert decisions == [("1", "continue"), ("2", "continue"), ("3", "continue"), ("4", "stop")], r.stdout
        assert f"rank {rank} ended at step 4 should_stop=True" in r.stdout
        assert (f"rank {rank} sweep config={json.dumps(config, sort_keys=True)} id=t7 dir={tmp_path}"
                in r.stdout), r.stdout
    assert [s["step"] for s in seen] == [1, 2, 3, 4]
    assert seen[0]["metrics"] == {"loss": 1.0, "rank": 0}


def test_outside_a_sweep_config_is_empty_and_reports_continue(job):
    r = run_python(job, ["-np", 2], WORKER, 3)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} sweep config={{}} id=None dir=None" in r.stdout, r.stdout
        assert f"rank {rank} ended at step 3 should_stop=False" in r.stdout, r.stdout
