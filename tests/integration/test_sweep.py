"""elasticrun sweep with real trial jobs on loopback hosts: build/examples/trial_objective is
the trial (loss = (log10(lr) + 1)^2 + (momentum - 0.9)^2 + exp(-step/50): the best trial is
lr = 0.1, momentum = 0.9 at every step)."""
import json
import re
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ELASTICRUN, EXAMPLES, ROOT, discovery_script

TRIAL = EXAMPLES / "trial_objective"
POOL = "127.0.0.1:2,127.0.0.2:2"  # 4 slots


def space(tmp_path, obj):
    p = tmp_path / "space.json"
    p.write_text(json.dumps(obj))
    return p


def read_jsonl(path):
    try:
        return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
    except FileNotFoundError:
        return []


def trials(exp):
    out = {}
    for d in sorted((Path(exp) / "trials").iterdir()):
        out[d.name] = {"status": json.loads((d / "status.json").read_text()),
                       "results": read_jsonl(d / "results.jsonl"),
                       "output": (d / "output.log").read_text() if (d / "output.log").exists() else ""}
    return out


def checkpointed(exp, k):
    """Whether trial k's rank 0 has written its checkpoint. trial_objective reports first
    and writes the checkpoint after: a trial stopped between the two starts again from
    step 0, and reports its first step twice."""
    return (exp / "trials" / k / "checkpoint" / "checkpoint.json").exists()


def wait_for_reports(exp, ids, timeout=60):
    """Until every trial named has reported once and checkpointed after it."""
    deadline = time.monotonic() + timeout
    def ready(k):
        return (exp / "trials" / k / "results.jsonl").exists() and checkpointed(exp, k)
    while time.monotonic() < deadline and not all(ready(k) for k in ids):
        time.sleep(0.05)
    assert all(ready(k) for k in ids), f"no report or checkpoint from trials {[k for k in ids if not ready(k)]}"


def sweep_args(exp, sp, *extra, steps=30, every=5, step_ms=20):
    return ["sweep", "-H", POOL, "--space", sp, "--metric", "loss", "--dir", exp, *extra, "--",
            TRIAL, "--steps", steps, "--report-every", every, "--step-ms", step_ms]


GRID12 = {"lr": {"grid": [0.001, 0.01, 0.1, 1.0]}, "momentum": {"grid": [0.5, 0.9, 0.99]}}


def test_asha_sweep_of_12_trials_over_a_smaller_pool(job, tmp_path):
    exp = tmp_path / "exp"
    events = tmp_path / "sweep.jsonl"
    r = job.run(sweep_args(exp, space(tmp_path, GRID12), "--scheduler", "asha", "--grace-period", "5",
                           "--reduction-factor", "3", "--max-t", "30", "--trial-np", "1:2", "--events", events),
                timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(exp)
    assert len(t) == 12
    states = {k: v["status"]["state"] for k, v in t.items()}
    assert set(states.values()) <= {"finished", "stopped"}, states
    stopped = [k for k, s in states.items() if s == "stopped"]
    assert stopped, "asha stopped no trial early"
    best = min(t.values(), key=lambda v: v["status"]["best_metric"])
    assert best["status"]["config"] == {"lr": 0.1, "momentum": 0.9}
    assert '"lr":0.1' in r.stdout and "best trial" in r.stdout
    for k in stopped:
        # Every rank of a stopped trial stopped at the step of its last report.
        last = t[k]["results"][-1]["step"]
        lines = [l for l in t[k]["output"].splitlines() if " stopped at step " in l]
        assert lines, t[k]["output"]
        assert all(f" stopped at step {last} " in l for l in lines), (last, lines)
        assert last < 30
    ev = read_jsonl(events)
    # The pool's 4 slots are never exceeded: trial_started / trial_resized / trial_ended.
    held, peak = {}, 0
    for e in ev:
        if e["event"] in ("trial_started", "trial_resized"):
            held[e["trial"]] = e["slots"]
        elif e["event"] == "trial_ended":
            held.pop(e["trial"], None)
        peak = max(peak, sum(held.values()))
    assert 0 < peak <= 4
    assert ev[-1]["event"] == "sweep_finished" and ev[-1]["best"]["config"] == {"lr": 0.1, "momentum": 0.9}


def test_trials_do_not_inherit_a_durable_checkpoint_directory(job, tmp_path):
    """ELASTICRUN_CHECKPOINT_DIR in the sweep's environment would make it every trial's
    --checkpoint-dir, and one trial would resume another's state."""
    exp, shared = tmp_path / "exp", tmp_path / "shared"
    sp = space(tmp_path, {"lr": {"grid": [0.01, 0.1]}})
    wrapper = tmp_path / "trial.sh"
    wrapper.write_text(f'#!/bin/sh\n[ -z "$ELASTICRUN_CHECKPOINT_DIR" ] || exit 4\nexec {TRIAL} "$@"\n')
    wrapper.chmod(0o755)
    r = job.run(["sweep", "-H", POOL, "--space", sp, "--metric", "loss", "--dir", exp, "--", wrapper, "--steps", 10,
                 "--report-every", 5], timeout=120, env={"ELASTICRUN_CHECKPOINT_DIR": str(shared)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert [t["status"]["state"] for t in trials(exp).values()] == ["finished", "finished"], trials(exp)
    assert not shared.exists()


def test_a_crashing_trial_is_failed_and_the_sweep_goes_on(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"crash": {"grid": [True, False]}, "lr": 0.1})
    wrapper = tmp_path / "trial.sh"
    wrapper.write_text(f'#!/bin/sh\ncase "$ELASTICRUN_TRIAL_CONFIG" in *\'"crash":true\'*) exit 3;; esac\n'
                       f'exec {TRIAL} "$@"\n')
    wrapper.chmod(0o755)
    r = job.run(["sweep", "-H", POOL, "--space", sp, "--metric", "loss", "--dir", exp, "--",
                 wrapper, "--steps", 10, "--report-every", 5], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(exp)
    assert t["0000"]["status"]["state"] == "failed" and "exited with code 3" in t["0000"]["status"]["why"], t["0000"]["status"]
    assert t["0001"]["status"]["state"] == "finished"
    assert "1 failed" in r.stdout


def test_sigkilled_sweep_resumes_without_running_finished_trials_again(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": {"grid": [0.01, 0.1, 1.0, 0.001]}})
    ev1 = tmp_path / "first.jsonl"
    p = subprocess.Popen([str(ELASTICRUN), *map(str, sweep_args(exp, sp, "--max-concurrent", "2", "--events", ev1,
                                                                  steps=40, step_ms=50))],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job.env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(e["event"] == "trial_ended" for e in read_jsonl(ev1)):
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    done_first = {e["trial"] for e in read_jsonl(ev1) if e["event"] == "trial_ended"}
    assert done_first, "no trial ended before the kill"
    # The trials' jobs die with the sweep (their death signal), workers with them.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-f", str(exp)], capture_output=True).returncode == 0:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", str(exp)], capture_output=True).returncode != 0
    ev2 = tmp_path / "second.jsonl"
    r = job.run(["sweep", "--resume", "--dir", exp, "-H", POOL, "--events", ev2], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    started_again = {e["trial"] for e in read_jsonl(ev2) if e["event"] == "trial_started"}
    assert not (started_again & done_first), (started_again, done_first)
    t = trials(exp)
    assert all(v["status"]["state"] == "finished" for v in t.values()), {k: v["status"] for k, v in t.items()}
    # A trial interrupted by the kill continued from its checkpoint, not from step 0.
    resumed = [k for k in started_again if t[k]["status"]["restarts"] > 0]
    for k in resumed:
        steps = [x["step"] for x in t[k]["results"]]
        assert steps[-1] == 40


@pytest.mark.parametrize("args,message", [
    (["--trial-np", "3:2"], "--trial-np '3:2': MAX is below MIN"),
    (["--scheduler", "hyperband"], "--scheduler 'hyperband'"),
    (["--mode", "median"], "--mode 'median'"),
    (["--scheduler", "asha", "--reduction-factor", "1"], "reduction_factor"),
    (["--asha-rule", "strict"], "--asha-rule strict needs --scheduler asha"),
    (["--scheduler", "asha", "--asha-rule", "loose"], "--asha-rule 'loose'"),
])
def test_bad_options_exit_2(job, tmp_path, args, message):
    r = job.run(["sweep", "--space", space(tmp_path, GRID12), "--metric", "loss", "--dir", tmp_path / "e", *args,
                 "--", TRIAL], timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "e" / "sweep.json").exists()


@pytest.mark.parametrize("obj,message", [
    ({"lr": {"loguniform": [-1, 1]}}, '"lr": loguniform'),
    ({"lr": {"grid": []}}, '"lr"'),
    ({"lr": {"uniform": [0, 1], "grid": [1]}}, '"lr"'),
])
def test_a_bad_space_file_exits_2_naming_the_field(job, tmp_path, obj, message):
    r = job.run(["sweep", "--space", space(tmp_path, obj), "--metric", "loss", "--dir", tmp_path / "e", "--", TRIAL],
                timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr


def test_a_directory_holding_a_sweep_is_refused_without_resume(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": 0.1})
    r = job.run(sweep_args(exp, sp, steps=5), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = job.run(sweep_args(exp, sp, steps=5), timeout=60)
    assert r.returncode == 2 and "already holds a sweep" in r.stderr, r.stderr


def test_every_sweep_flag_in_help_is_in_the_man_page(job):
    r = job.run(["sweep", "--help"])
    assert r.returncode == 0, r.stderr
    flags = sorted(set(re.findall(r"^\s+(?:-\w, )?--([a-z][a-z-]*)", r.stdout, re.M)))
    assert len(flags) > 20 and "trial-np" in flags, r.stdout
    man = (ROOT / "man" / "elasticrun-sweep.1").read_text().replace("\\-", "-")
    assert [f for f in flags if f"--{f}" not in man] == []


def test_a_trial_whose_worker_is_killed_continues_elastically(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": 0.1})
    p = job.start(["sweep", "-H", "127.0.0.1:1,127.0.0.2:1", "--trial-np", "1:2", "--space", sp, "--metric", "loss",
                   "--dir", exp, "--", TRIAL, "--steps", 60, "--report-every", 5, "--step-ms", 50])
    trial_events = exp / "trials" / "0000" / "events.jsonl"
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline:
        ev = read_jsonl(trial_events)
        if any(e["event"] == "epoch_started" and e["size"] == 2 for e in ev) and \
                any(e["event"] == "report" and e["size"] == 2 for e in ev):
            workers = [e for e in ev if e["event"] == "worker_started"]
            break
        time.sleep(0.05)
    assert len(workers) >= 2, read_jsonl(trial_events)
    victim = next(w for w in workers if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    t = trials(exp)["0000"]
    assert t["status"]["state"] == "finished", t["status"]
    assert t["results"][-1]["step"] == 60
    ev = read_jsonl(trial_events)
    assert any(e["event"] == "reset" for e in ev)
    assert any(e["event"] == "worker_exited" and e["pid"] == victim["pid"] and e["signal"] == signal.SIGKILL for e in ev)
    assert "rank 0 finished at step 60" in t["output"]


def test_pbt_continues_a_bottom_trial_from_a_top_trials_checkpoint(job, tmp_path):
    exp = tmp_path / "exp"
    events = tmp_path / "sweep.jsonl"
    sp = space(tmp_path, {"lr": {"grid": [0.1, 0.001, 0.09, 0.002]}, "momentum": {"uniform": [0.5, 0.99]}})
    r = job.run(sweep_args(exp, sp, "--scheduler", "pbt", "--perturbation-interval", "10", "--seed", "3",
                           "--events", events, steps=60, step_ms=30), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    ev = read_jsonl(events)
    # An exploit at the last step has nothing left to run.
    exploits = [e for e in ev if e["event"] == "trial_exploit" and e["step"] < 60]
    assert exploits, r.stdout
    t = trials(exp)
    for e in exploits:
        mine = t[e["trial"]]
        assert mine["status"]["restarts"] >= 1
        # It went on from the source's checkpoint (at least the step it was exploited at,
        # the source being at least as far), not from step 0.
        after = [x["step"] for x in mine["results"] if x["t"] > e["t"]]
        assert after and after[0] > 5 and e["step"] >= 10, (e, after)
        started = [x for x in ev if x["event"] == "trial_started" and x["trial"] == e["trial"] and x["t"] > e["t"]]
        assert started and started[0]["config"] == e["config"]
    assert all(v["status"]["state"] == "finished" for v in t.values())
    # params.json follows the configuration the trial runs with now.
    for k, v in t.items():
        assert json.loads((exp / "trials" / k / "params.json").read_text()) == v["status"]["config"]


def test_sigint_stops_every_trial_and_resume_finishes_them(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": {"grid": [0.1, 0.01]}})
    p = job.start(sweep_args(exp, sp, steps=200, step_ms=50))
    wait_for_reports(exp, ("0000", "0001"))
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "interrupted by SIGINT" in out and "2 unfinished" in out, out
    t = trials(exp)
    assert all(v["status"]["state"] == "pending" for v in t.values()), {k: v["status"] for k, v in t.items()}
    first = {k: v["results"][-1]["step"] for k, v in t.items()}
    r = job.run(["sweep", "--resume", "--dir", exp, "-H", POOL], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(exp)
    for k, v in t.items():
        assert v["status"]["state"] == "finished"
        steps = [x["step"] for x in v["results"]]
        # It went on from its checkpoint: after the interruption the steps continue near
        # where they were (the last checkpoint), not from the first report again.
        resumed = steps[steps.index(first[k]) + 1]
        assert resumed > 5 and resumed <= first[k] + 5, steps
        assert steps[-1] == 200


def test_the_table_is_redrawn_in_place_on_a_terminal(job, tmp_path):
    import pty
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": {"grid": [0.1, 0.01, 1.0]}})
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(job.env())
        args = [str(a) for a in sweep_args(exp, sp, steps=40, step_ms=50)]
        os.execv(str(ELASTICRUN), [str(ELASTICRUN), *args])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "\x1b[J" in text and "\x1b[" in text  # cursor moved up, old table cleared
    assert text.count("trial  state") >= 2, text  # the header, drawn more than once
    assert "best loss so far:" in text
    assert "best trial 0000" in text


def test_the_pool_follows_its_discovery_script_and_trials_grow_and_shrink(job, tmp_path):
    exp = tmp_path / "exp"
    hosts, script = discovery_script(tmp_path, ["127.0.0.1:1"])
    sp = space(tmp_path, {"lr": 0.1})
    events = tmp_path / "sweep.jsonl"
    p = job.start(["sweep", "--host-discovery-script", script, "--discovery-interval", "0.2", "--trial-np", "1:2",
                   "--space", sp, "--metric", "loss", "--dir", exp, "--events", events, "--",
                   TRIAL, "--steps", 400, "--report-every", 5, "--step-ms", 30])
    trial_events = exp / "trials" / "0000" / "events.jsonl"

    def wait_for_size(n):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reports = [e for e in read_jsonl(trial_events) if e["event"] == "report"]
            if reports and reports[-1]["size"] == n:
                return
            time.sleep(0.05)
        raise AssertionError(f"trial never reported with {n} workers: {read_jsonl(trial_events)[-5:]}")

    wait_for_size(1)
    hosts.write_text("127.0.0.1:1\n127.0.0.2:1\n")  # the pool grows: the trial grows into it
    wait_for_size(2)
    hosts.write_text("127.0.0.2:1\n")  # 127.0.0.1 leaves: the trial shrinks to what is left
    wait_for_size(1)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    resized = [e["slots"] for e in read_jsonl(events) if e["event"] == "trial_resized"]
    assert resized[:2] == [2, 1], resized
    t = trials(exp)["0000"]
    assert t["status"]["state"] == "finished" and t["results"][-1]["step"] == 400
    last_epoch = [e for e in read_jsonl(trial_events) if e["event"] == "epoch_started"][-1]
    assert [w["host"] for w in last_epoch["assignment"]] == ["127.0.0.2"]


def test_a_host_whose_daemon_is_lost_leaves_the_pool(job, tmp_path):
    exp = tmp_path / "exp"
    events = tmp_path / "sweep.jsonl"
    sp = space(tmp_path, {"lr": {"grid": [0.1, 0.01]}})
    p = job.start(["sweep", "-H", "127.0.0.1:1,127.0.0.2:1", "--space", sp, "--metric", "loss", "--dir", exp,
                   "--events", events, "--", TRIAL, "--steps", 150, "--report-every", 5, "--step-ms", 30])
    victim, deadline = None, time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        for k in ("0000", "0001"):
            ev = read_jsonl(exp / "trials" / k / "events.jsonl")
            if any(e["event"] == "report" for e in ev) and checkpointed(exp, k):
                w = [e for e in ev if e["event"] == "worker_started" and e["host"] == "127.0.0.2"]
                if w:
                    victim = (k, w[0]["pid"])
        time.sleep(0.05)
    assert victim, "no trial reported from 127.0.0.2"
    trial, worker = victim
    daemon = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    assert b"elasticrund" in Path(f"/proc/{daemon}/cmdline").read_bytes()
    os.kill(daemon, signal.SIGKILL)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, out + err
    ev = read_jsonl(events)
    assert [e["host"] for e in ev if e["event"] == "host_removed"] == ["127.0.0.2"], ev
    t = trials(exp)
    assert all(v["status"]["state"] == "finished" and v["results"][-1]["step"] == 150 for v in t.values())
    # The trial that lost its host (its only worker was there) started again from its
    # checkpoint, on the slot the other trial left.
    assert [e["trial"] for e in ev if e["event"] == "trial_restarted"] == [trial]
    assert t[trial]["status"]["restarts"] == 1
    steps = [x["step"] for x in t[trial]["results"]]
    assert steps.count(5) == 1, steps  # not from the first step again
    epochs = [e for e in read_jsonl(exp / "trials" / trial / "events.jsonl") if e["event"] == "epoch_started"]
    assert [w["host"] for w in epochs[-1]["assignment"]] == ["127.0.0.1"], epochs


def test_a_second_sigint_kills_the_trials_at_once(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": {"grid": [0.1, 0.01]}})
    p = job.start(sweep_args(exp, sp, steps=2000, step_ms=50))
    wait_for_reports(exp, ("0000", "0001"))
    # The trials' jobs are stopped (SIGSTOP): they cannot act on the first signal's SIGTERM.
    jobs = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and
            (d / "stat").exists() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == p.pid]
    assert len(jobs) == 2, jobs
    for pid in jobs:
        os.kill(pid, signal.SIGSTOP)
    p.send_signal(signal.SIGINT)
    time.sleep(1)
    assert p.poll() is None, "the first signal did not wait for the trials' jobs"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 5, "the second signal did not end the sweep at once"
    assert p.returncode == 130, out + err
    assert "second signal" in out
    for pid in jobs:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


def test_every_rank_of_a_stopped_trial_stops_at_the_same_step_and_the_plot_shows_it(job, tmp_path):
    exp = tmp_path / "exp"
    sp = space(tmp_path, {"lr": {"grid": [0.1, 0.001, 1.0, 0.003]}})
    r = job.run(sweep_args(exp, sp, "--scheduler", "asha", "--grace-period", "5", "--reduction-factor", "2",
                           "--max-t", "40", "--trial-np", "2:2", steps=40), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(exp)
    stopped = [k for k, v in t.items() if v["status"]["state"] == "stopped"]
    assert stopped, {k: v["status"]["state"] for k, v in t.items()}
    for k in stopped:
        found = re.findall(r"rank (\d) stopped at step (\d+) ", t[k]["output"])
        assert sorted(found) == [("0", str(t[k]["results"][-1]["step"])), ("1", str(t[k]["results"][-1]["step"]))], \
            t[k]["output"]
    svg = tmp_path / "plot.svg"
    p = subprocess.run(["/usr/bin/python3", ROOT / "scripts" / "sweep-plot", exp, "-o", svg], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    text = svg.read_text()
    assert "<svg" in text and "stopped early" in text and "trial 0000 (best)" in text
    bad = subprocess.run(["/usr/bin/python3", ROOT / "scripts" / "sweep-plot", exp, "-o", tmp_path / "plot.gif"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and ".png or .svg" in bad.stderr
