"""Elastic Horovod's integration scenarios (those of Horovod's test/integration/
elastic_common.py, which scripts/horovod-elastic runs with Horovod's own program) through
elasticrun's CLI, with a program of our own (workers/epoch_log.py): hosts added and
removed by a discovery schedule, one rank failing by exception and by SIGKILL with and
without a discovery script, every rank failing, every host blacklisted, too few slots for
--elastic-timeout, the reset limit, and a blacklisted host coming back after its
cool-down, for longer after a second failure. Rank 0 logs a line per epoch; the checks are
on those lines, the exit status, the reason printed and the --events log."""
import json
import re
import time

import pytest

from conftest import HERE, PYTHON, job, python_env  # noqa: F401 (job: a fixture)

WORKER = HERE / "workers" / "epoch_log.py"
BOTH = ["localhost:2", "127.0.0.1:2"]
FAIL_WITHIN = 60  # seconds: a job that cannot go on ends at once, not after --elastic-timeout's 600


def scheduled_discovery(tmp_path, logfile, schedule):
    """A discovery script that answers schedule[i]'s hosts while rank 0 has logged i
    epochs; the entry whose epoch is None answers for every later count."""
    script = tmp_path / "discover.sh"
    cases = "".join(f"  {'*' if epoch is None else epoch}) printf '%s\\n' {' '.join(hosts)} ;;\n"
                    for epoch, hosts in schedule)
    script.write_text(f'#!/bin/sh\nn=$(cat "{logfile}" 2>/dev/null | wc -l)\ncase "$n" in\n{cases}esac\n')
    script.chmod(0o755)
    return script


def run_scenario(job, tmp_path, schedule=None, hosts=None, np=2, min_np=2, max_np=4, exits=None,
                 exit_mode="exception", options=(), **worker):
    """One job: returns (CompletedProcess, seconds it took, rank 0's epoch lines, events)."""
    tmp_path.mkdir(exist_ok=True)
    logfile, events = tmp_path / "epochs", tmp_path / "events"
    args = ["-x", "PYTHONPATH", "-np", np, "--min-np", min_np, "--discovery-interval", 0.1, "--events", events,
            *options]
    if hosts:
        args += ["-H", hosts]
    else:
        args += ["--host-discovery-script", scheduled_discovery(tmp_path, logfile, schedule), "--max-np", max_np]
    args += [PYTHON, WORKER, "--logfile", logfile, "--schedule", json.dumps(schedule or []),
             "--exits", json.dumps(exits or {}), "--exit-mode", exit_mode]
    for name, value in worker.items():
        args += ["--" + name.replace("_", "-"), json.dumps(value)]
    start = time.monotonic()
    r = job.run(args, timeout=180, env=python_env())
    took = time.monotonic() - start
    lines = [json.loads(l) for l in logfile.read_text().splitlines()] if logfile.exists() else []
    return r, took, lines, job.events(events)


def expect(lines, *wanted):
    """Each epoch line has the wanted fields (a dict per line; None: not checked)."""
    assert len(lines) == len(wanted), lines
    for i, (line, fields) in enumerate(zip(lines, wanted)):
        if fields is not None:
            assert {k: line[k] for k in fields} == fields, f"epoch line {i}: {line}"


def expect_failed(r, took, reason, code=1):
    """Exit `code` (elasticrun(1), EXIT STATUS) within FAIL_WITHIN seconds, `reason` printed."""
    assert r.returncode == code, r.stdout[-2000:] + r.stderr[-3000:]
    assert took < FAIL_WITHIN, f"took {took:.0f} s to fail"
    assert re.search(reason, r.stderr), r.stderr[-3000:]


@pytest.mark.parametrize("slots", [2, 1])
def test_hosts_added_and_removed(job, tmp_path, slots):
    """localhost, then localhost and 127.0.0.1, then 127.0.0.1 alone: the survivors go on
    without restarting (the last epoch is logged by a worker that started as rank
    `slots`, in its third rendezvous). The script's own `commits` attribute counts its
    commits exactly: the library's count (State.commits) does not write to it."""
    schedule = [(0, [f"localhost:{slots}"]), (1, [f"localhost:{slots}", f"127.0.0.1:{slots}"]),
                (None, [f"127.0.0.1:{slots}"])]
    r, _, lines, _ = run_scenario(job, tmp_path, schedule, np=slots, min_np=slots, max_np=2 * slots)
    assert r.returncode == 0, r.stderr[-3000:]
    # 10 batch commits an epoch and one at its end; the script's own count of them
    expect(lines, dict(start_rank=0, size=slots, hostname="localhost", rendezvous=1, commits=10),
           dict(start_rank=0, size=2 * slots, hostname="localhost", rendezvous=2, commits=21),
           dict(start_rank=slots, size=slots, hostname="127.0.0.1", rendezvous=3, commits=32))


@pytest.mark.parametrize("exit_mode", ["exception", "kill"])
@pytest.mark.parametrize("discovery", [True, False], ids=["discovery", "fixed_hosts"])
def test_single_rank_failure(job, tmp_path, exit_mode, discovery):
    """Rank 0 fails at the start of epoch 1: its host is blacklisted, the two workers of
    127.0.0.1 go on from the last commit (rank 0 now the one that started as rank 2)."""
    hosts = dict(schedule=[(None, BOTH)]) if discovery else dict(hosts=",".join(BOTH))
    r, _, lines, events = run_scenario(job, tmp_path, exits={"1,0": [0]}, exit_mode=exit_mode, **hosts)
    assert r.returncode == 0, r.stderr[-3000:]
    expect(lines, dict(start_rank=0, size=4, rendezvous=1), dict(start_rank=2, size=2, rendezvous=2),
           dict(start_rank=2, size=2, rendezvous=2))
    assert [e["host"] for e in events if e["event"] == "host_blacklisted"] == ["localhost"], events


def test_all_ranks_failure(job, tmp_path):
    r, took, lines, _ = run_scenario(job, tmp_path, [(None, BOTH)], exits={"1,0": [0, 1, 2, 3]})
    expect_failed(r, took, r"every host discovery lists is blacklisted.*'localhost': exited with code 1")
    expect(lines, dict(size=4))


def test_all_hosts_blacklisted(job, tmp_path):
    """One worker of each host fails: both hosts are blacklisted for good and the job
    ends with the reason, not after --elastic-timeout."""
    r, took, _, _ = run_scenario(job, tmp_path, [(None, BOTH)], exits={"1,0": [0, 2]})
    expect_failed(r, took, r"none can come back.*'localhost': exited with code 1; '127.0.0.1': exited with code 1")


def test_min_hosts_timeout(job, tmp_path):
    """-np 4 --min-np 4 and one host blacklisted: 2 slots are left, and the job fails once
    --elastic-timeout (1 s) has passed (the discovery script could still offer more)."""
    r, took, _, _ = run_scenario(job, tmp_path, [(None, BOTH)], np=4, min_np=4, exits={"1,0": [0]},
                                 options=["--elastic-timeout", 1])
    expect_failed(r, took, r"fewer than 4 slots available for 1 s \(--elastic-timeout\); 2 now", code=4)


@pytest.mark.parametrize("limit", [1, 2])
def test_reset_limit(job, tmp_path, limit):
    """The schedule makes two resets (a host added, a host removed): --reset-limit 1 ends
    the job at the second, --reset-limit 2 lets it finish."""
    schedule = [(0, ["localhost:2"]), (1, BOTH), (None, ["127.0.0.1:2"])]
    r, took, lines, _ = run_scenario(job, tmp_path, schedule, options=["--reset-limit", limit, "--elastic-timeout", 1])
    if limit == 1:
        expect_failed(r, took, r"reset limit 1 reached")
        expect(lines, dict(size=2), dict(size=4))
    else:
        assert r.returncode == 0, r.stderr[-3000:]
        expect(lines, dict(size=2), dict(size=4), dict(size=2, rendezvous=3))


def test_blacklisted_host_comes_back_after_its_cooldown(job, tmp_path):
    """--blacklist-cooldown-range 2 8: the worker that started as rank 3 fails in epoch 1,
    127.0.0.1 is out for 2 s and comes back (rank 0 waits for it at the end of epoch 2);
    its new worker that started as rank 3 fails in epoch 4, and the host is out again for
    twice as long (4 s: the job ends without it). Horovod's own scenario (scripts/horovod-elastic) only checks that
    the host stays out while its short job runs; this one sees it come back."""
    r, _, lines, events = run_scenario(job, tmp_path, [(None, BOTH)], exits={"1,0": [3], "4,0": [3]}, epochs=6,
                                       wait_at=[2], options=["--blacklist-cooldown-range", 2, 8])
    assert r.returncode == 0, r.stderr[-3000:]
    expect(lines, dict(size=4, rendezvous=1), dict(size=2, rendezvous=2), dict(size=2, rendezvous=2),
           dict(size=4, rendezvous=3), dict(size=2, rendezvous=4), dict(size=2, rendezvous=4))
    out = [e for e in events if e["event"] == "host_blacklisted"]
    assert [e["host"] for e in out] == ["127.0.0.1", "127.0.0.1"], events
    assert [e["cooldown_s"] for e in out] == [2, 4], out
