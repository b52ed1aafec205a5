"""elasticrun.report, should_stop and elasticrun.sweep in Python workers under the real
launcher, with the test answering reports on --report-fd."""
import json
import re
import socket
import threading

from conftest import HERE, ROOT, python_env, run_python

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


def test_the_digits_trial_under_an_asha_sweep(job, tmp_path):
    """examples/python/digits_trial.py as the trials of a real sweep: every trial reports
    the held-out loss and accuracy each epoch, asha stops the worst at its first rung,
    and the best trial's model learnt the digits. One trial at a time (growing to both
    slots), so that the order trials reach a rung, and with it asha's decisions, is fixed:
    the first at a rung always goes on."""
    import json as _json
    exp = tmp_path / "exp"
    sp = tmp_path / "space.json"
    sp.write_text(_json.dumps({"lr": {"grid": [0.02, 0.0001, 0.01]}, "batch_size": 32}))
    script = ROOT / "examples" / "python" / "digits_trial.py"
    r = job.run(["sweep", "-H", "127.0.0.1:2", "--trial-np", "1:2", "--space", sp, "--metric", "loss",
                 "--scheduler", "asha", "--grace-period", "2", "--reduction-factor", "2", "--max-t", "6",
                 "--max-concurrent", "1", "--dir", exp, "-x", "PYTHONPATH", "--",
                 "/usr/bin/python3", script, "--epochs", 6], timeout=300, env=python_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    states, best = {}, None
    for d in sorted((exp / "trials").iterdir()):
        st = _json.loads((d / "status.json").read_text())
        results = [_json.loads(l) for l in (d / "results.jsonl").read_text().splitlines()]
        assert [x["step"] for x in results] == list(range(1, len(results) + 1)), results
        assert all(set(x["metrics"]) == {"loss", "accuracy"} for x in results)
        states[st["config"]["lr"]] = st["state"]
        if best is None or st["best_metric"] < best[0]:
            best = (st["best_metric"], st["config"]["lr"], results[-1]["metrics"]["accuracy"])
    assert states[0.0001] == "stopped", states  # far too small a step: cut at a rung
    assert best[1] in (0.02, 0.01) and best[2] > 0.9, best
