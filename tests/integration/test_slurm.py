"""elasticrun inside a real Slurm allocation (scripts/slurmcluster: Debian's slurmctld in
this namespace, one slurmd in each namespace host of scripts/testcluster, munge): the hosts
come from the allocation's environment and the daemons start as job steps through srun,
under salloc and under sbatch; an elastic job follows the nodes Slurm drains and resumes
(scripts/discovery/slurm) without losing committed state; scancel leaves no process of the
job on any node, and with --checkpoint-dir a checkpoint of the last commit that the next
allocation resumes from."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ELASTICRUN, EXAMPLES, ROOT, our_processes, skip_unless_required, wait_for_progress
from invariant import check_commits
from test_sgd import finals, reference

SLURMCLUSTER = ROOT / "scripts" / "slurmcluster"
NODES = ["er-h1", "er-h2", "er-h3"]
SGD = EXAMPLES / "elastic_sgd"


@pytest.fixture(scope="module")
def slurm():
    """The Slurm cluster's environment (SLURM_CONF ...), up for this module."""
    # KillWait: the SIGKILL comes 10 s after a cancel's SIGTERM, room for the preemption tests'
    # last checkpoint (--preempt-grace 5 and the workers' stop).
    r = subprocess.run([str(SLURMCLUSTER), "up", "3", "--cpus", "2"], capture_output=True, text=True, timeout=180,
                       env={**os.environ, "SLURMCLUSTER_KILL_WAIT": "10"})
    if r.returncode == 77:
        skip_unless_required("netns", "no Slurm cluster here: " + (r.stderr.strip().splitlines() or ["exit 77"])[-1])
    assert r.returncode == 0, r.stderr
    env_file = Path(re.search(r"SLURM_ENV=(\S+)", r.stdout).group(1))
    env = dict(re.findall(r'^export (\w+)="?([^"\n]*)"?$', env_file.read_text(), re.M))
    yield env
    subprocess.run([str(SLURMCLUSTER), "down"], capture_output=True, timeout=120)


def slurm_env(job, slurm, extra=None):
    return job.env({**slurm, **(extra or {})})


def steps_now(env):
    """The running job steps as (name, node) pairs."""
    r = subprocess.run(["squeue", "-s", "-h", "-o", "%j %N"], capture_output=True, text=True, env=env, timeout=30)
    return [tuple(l.split()) for l in r.stdout.splitlines() if l.strip()]


SGD_ARGS = ["--steps", 300, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 20]


def test_salloc_job_takes_the_allocations_nodes_and_starts_daemons_as_steps(job, slurm, tmp_path):
    """salloc -N3 --ntasks-per-node=2 elasticrun elastic_sgd: 6 workers, 2 on each node,
    with no host flag; each node's daemon runs as a job step named elasticrund (salloc runs
    the driver here, on none of the nodes); every rank ends with the reference model."""
    env = slurm_env(job, slurm)
    events = tmp_path / "events"
    p = subprocess.Popen(["salloc", "-N3", "--ntasks-per-node=2", str(ELASTICRUN), "--events", str(events), str(SGD),
                          *map(str, SGD_ARGS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen = set()
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline and len(seen) < 3:
        seen |= {node for name, node in steps_now(env) if name == "elasticrund"}
        time.sleep(0.1)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    assert seen == set(NODES), f"elasticrund steps seen on {seen}"
    want = reference(SGD_ARGS)
    assert finals(out) == [want] * 6, out[-3000:]
    placed = [e for e in job.events(events) if e["event"] == "epoch_started"][0]
    hosts = sorted(w["host"] for w in placed["assignment"])
    assert hosts == sorted(NODES * 2), placed


def test_sbatch_job_runs_from_its_batch_node(job, slurm, tmp_path):
    """The same job as a batch script (#SBATCH -N3): elasticrun runs on the first node,
    starts that node's daemon itself and the others' through srun; the output file has
    every rank's final line, the exit status and (--events /dev/stderr) the job's events."""
    out_file = tmp_path / "slurm.out"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/sh
#SBATCH -N3 --ntasks-per-node=1 -o {out_file}
{ELASTICRUN} --events /dev/stderr {SGD} {' '.join(map(str, SGD_ARGS))}
echo "elasticrun exit $?"
""")
    env = slurm_env(job, slurm)
    r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=env, timeout=30)
        if not q.stdout.strip():
            break
        time.sleep(0.2)
    text = out_file.read_text()
    assert "elasticrun exit 0" in text, text[-3000:]
    assert finals(text) == [reference(SGD_ARGS)] * 3, text[-3000:]
    # --events /dev/stderr: the event lines land in the job's output file, where Slurm collects them.
    finished = [json.loads(l) for l in text.splitlines() if l.startswith('{"') and '"job_finished"' in l]
    assert [e["status"] for e in finished] == [0], text[-3000:]


def test_drained_node_leaves_an_elastic_job_and_returns_when_resumed(job, slurm, tmp_path):
    """An elastic job on the 3 nodes with scripts/discovery/slurm: `scontrol update
    State=DRAIN` of er-h3 mid-run takes it out of the job (the others go on from their
    last commit), State=RESUME brings it back; rank 0's commits never go back and every
    final model is the reference."""
    env = slurm_env(job, slurm)
    events = tmp_path / "events"
    args = ["--steps", 600, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 25]
    p = subprocess.Popen(["salloc", "-N3", str(ELASTICRUN), "--min-np", "2", "--host-discovery-script",
                          str(ROOT / "scripts" / "discovery" / "slurm"), "--discovery-interval", "0.3", "--events",
                          str(events), str(SGD), *map(str, args), "--report"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def wait_for(what, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            evs = job.events(events)
            if what(evs):
                return evs
            assert p.poll() is None, "the job ended early: " + p.stderr.read()[-3000:]
            time.sleep(0.1)
        raise AssertionError(f"timed out; events: {job.events(events)[-10:]}")

    def sizes(evs):
        return [len(e["assignment"]) for e in evs if e["event"] == "epoch_started"]

    wait_for(lambda evs: sizes(evs)[:1] == [3] and any(e["event"] == "state_synced" for e in evs))
    time.sleep(1)
    drain = ["scontrol", "update", "NodeName=er-h3"]
    subprocess.run(drain + ["State=DRAIN", "Reason=elasticrun test"], check=True, env=env, timeout=30)
    try:
        wait_for(lambda evs: any(e["event"] == "host_removed" and e["host"] == "er-h3" for e in evs) and
                 sizes(evs)[-1] == 2)
    finally:
        subprocess.run(drain + ["State=RESUME"], check=True, env=env, timeout=30)
    wait_for(lambda evs: any(e["event"] == "host_added" and e["host"] == "er-h3" for e in evs) and
             sizes(evs)[-1] == 3)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    check_commits(out, 600, min_epoch=3)
    assert finals(out) == [reference(args)] * 3, out[-3000:]


def test_scancel_leaves_no_process_on_any_node(job, slurm, tmp_path):
    """A long batch job on 3 nodes, cancelled with scancel once its workers run on every
    node: within 20 s no process of it (driver, daemons, workers: found by the job's tag
    in their environment) is left on any node, and (the job fixture's check) nothing in
    /dev/shm; Slurm would SIGKILL whatever is left only 10 s after its SIGTERM (KillWait).
    The batch script execs elasticrun, as the README says to: scancel's SIGTERM goes to
    the batch shell only."""
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/sh
#SBATCH -N3 -o {tmp_path}/slurm.out
exec {ELASTICRUN} {SGD} --steps 1000000 --dim 64 --batch 48 --step-ms 50
""")
    env = slurm_env(job, slurm)
    r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]

    def workers():
        found = set()
        for pid in our_processes(job.tag):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/elastic_sgd"):
                    found.add(Path(f"/proc/{pid}/environ").read_bytes().split(b"ELASTICRUN_HOST=")[1].split(b"\0")[0])
            except (OSError, IndexError):
                pass
        return found

    deadline = time.monotonic() + 60
    while workers() != {n.encode() for n in NODES} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers() == {n.encode() for n in NODES}, (tmp_path / "slurm.out").read_text()[-2000:]
    subprocess.run(["scancel", job_id], check=True, env=env, timeout=30)
    deadline = time.monotonic() + 20
    while our_processes(job.tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = our_processes(job.tag)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p in left]


def test_elastic_job_grows_by_asking_slurm_and_gives_back_what_it_does_not_use(job, slurm, tmp_path):
    """scripts/request-hosts/slurm: a job on one node with --max-np 3 asks for 2 slots; the
    helper allocation's 2 nodes are merged into the job (Slurm's job expansion) and the job
    trains on 3 workers. A job on 3 nodes with --max-np 2 gives its unused node back: the
    allocation shrinks to 2 nodes while the job runs."""
    env = slurm_env(job, slurm)
    request = str(ROOT / "scripts" / "request-hosts" / "slurm")
    discover = str(ROOT / "scripts" / "discovery" / "slurm")
    events = tmp_path / "events"
    args = ["--steps", 300, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 20]
    r = subprocess.run(["salloc", "-N1", "-w", "er-h1", str(ELASTICRUN), "--min-np", "1", "--max-np", "3",
                        "--host-discovery-script", discover, "--discovery-interval", "0.3", "--request-hosts-script",
                        request, "--request-interval", "1", "--events", str(events), str(SGD), *map(str, args)],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    evs = job.events(events)
    assert [e["slots"] for e in evs if e["event"] == "hosts_requested"][:1] == [2], evs
    sizes = [e["size"] for e in evs if e["event"] == "epoch_started"]
    assert sizes[0] == 1 and sizes[-1] == 3, sizes
    assert finals(r.stdout) == [reference(args)] * 3, r.stdout[-3000:]

    events2 = tmp_path / "events2"
    script = tmp_path / "shrink.sh"
    script.write_text(f"""#!/bin/sh
{ELASTICRUN} --min-np 1 --max-np 2 --host-discovery-script {discover} --discovery-interval 0.3 \\
  --request-hosts-script {request} --request-interval 1 --events {events2} {SGD} {' '.join(map(str, args))} &
pid=$!
sleep 4; squeue -h -j $SLURM_JOB_ID -o 'nodes %D'
wait $pid; echo "elasticrun exit $?"
""")
    script.chmod(0o755)
    r = subprocess.run(["salloc", "-N3", str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert "elasticrun exit 0" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    released = [e for e in job.events(events2) if e["event"] == "hosts_released"]
    assert released and len(released[0]["hosts"]) == 1, job.events(events2)
    assert "nodes 2" in r.stdout, r.stdout


def wait_gone(env, job_id, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=env, timeout=30)
        if not q.stdout.strip():
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still in squeue after {timeout} s")


PREEMPT_ARGS = ["--steps", 600, "--dim", 64, "--batch", 48, "--commit-every", 5]
ONLY_ON_REQUEST = ["--checkpoint-every", 0, "--checkpoint-interval", 3600, "--preempt-grace", 5]


def test_scancel_of_a_batch_job_leaves_a_checkpoint_that_the_next_allocation_resumes(job, slurm, tmp_path):
    """scancel (as preemption and the time limit do) sends SIGTERM to the batch script's
    elasticrun and to the daemons' steps, SIGKILL 10 s later. The driver asks for a last
    checkpoint (none is due by count or time here) and stops once it is written, before
    the SIGKILL; a new allocation with the same --checkpoint-dir restores that commit and
    ends with the model of an uninterrupted run."""
    ck, ev, progress, out_file = tmp_path / "ck", tmp_path / "events", tmp_path / "progress", tmp_path / "slurm.out"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/sh
#SBATCH -N3 -o {out_file}
exec {ELASTICRUN} --events {ev} --checkpoint-dir {ck} {' '.join(map(str, ONLY_ON_REQUEST))} \\
    {SGD} {' '.join(map(str, PREEMPT_ARGS))} --step-ms 20 --progress-file {progress}
""")
    env = slurm_env(job, slurm)
    r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    wait_for_progress(progress, 50)
    cancelled = time.monotonic()
    subprocess.run(["scancel", job_id], check=True, env=env, timeout=30)
    wait_gone(env, job_id)
    events = job.events(ev)
    kinds = [e["event"] for e in events]
    text = out_file.read_text()
    assert "preempting" in kinds, (kinds, text[-2000:])
    # Every save was asked for (none is due by count or time). The daemons' notices may
    # get one written before the driver's own SIGTERM asks again: then there are two,
    # and the driver stops on the second, the newest commit.
    saved = [e for e in events if e["event"] == "checkpoint_saved"]
    assert 1 <= len(saved) <= 2 and all(e["requested"] for e in saved), saved
    finished = [e for e in events if e["event"] == "job_finished"]
    assert finished and finished[0]["status"] == 143, finished
    # Done before Slurm's SIGKILL: the driver wrote its last event itself.
    assert finished[0]["t"] - [e for e in events if e["event"] == "preempting"][0]["t"] < 5, events[-5:]
    commit = saved[-1]["commit"]
    assert commit >= 10, saved
    assert f"commit {commit} is in checkpoint {ck}/" in text, text[-2000:]
    print(f"scancel -> checkpoint of commit {commit} in {saved[-1]['t'] - events[kinds.index('preempting')]['t']:.3f} s; "
          f"job gone from squeue {time.monotonic() - cancelled:.1f} s after scancel")

    r = subprocess.run(["salloc", "-N3", str(ELASTICRUN), "--checkpoint-dir", str(ck), str(SGD),
                        *map(str, PREEMPT_ARGS)], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"rank 0 restored commit {commit} from {ck}/" in r.stderr, r.stderr[-2000:]
    assert finals(r.stdout) == [reference(PREEMPT_ARGS)] * 3, r.stdout[-2000:]


def test_scancel_under_salloc_asks_for_the_checkpoint_through_the_daemons(job, slurm, tmp_path):
    """salloc does not signal its command when the allocation is revoked: only the
    daemons' steps get SIGTERM. Each tells the driver, which asks for the checkpoint; it is
    written before the daemons stop their workers, and nothing of the job is left."""
    ck, ev, progress = tmp_path / "ck", tmp_path / "events", tmp_path / "progress"
    env = slurm_env(job, slurm)
    p = subprocess.Popen(["salloc", "-N3", str(ELASTICRUN), "--events", str(ev), "--checkpoint-dir", str(ck),
                          *map(str, ONLY_ON_REQUEST), str(SGD), *map(str, PREEMPT_ARGS), "--step-ms", "20",
                          "--progress-file", str(progress)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_for_progress(progress, 50)
    job_id = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env,
                            timeout=30).stdout.split()[0]
    subprocess.run(["scancel", job_id], check=True, env=env, timeout=30)
    out, err = p.communicate(timeout=90)
    events = job.events(ev)
    preempted = sorted(e["host"] for e in events if e["event"] == "host_preempted")
    assert preempted == NODES, (preempted, err[-2000:])
    saved = [e for e in events if e["event"] == "checkpoint_saved"]
    assert len(saved) == 1 and saved[0]["requested"] and saved[0]["commit"] >= 10, saved
    lost = [e for e in events if e["event"] == "worker_exited"]
    assert lost and min(e["t"] for e in lost) > saved[0]["t"], (saved, lost[:3])
    deadline = time.monotonic() + 20
    while our_processes(job.tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not our_processes(job.tag)


TASK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID")


def worker_environments(out):
    """{rank: {name: value}} of the SLURM_ variables from `elasticrun ... /usr/bin/env`."""
    envs = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+)\]<stdout>: (SLURM_\w+)=(.*)", line)
        if m:
            envs.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    return envs


def test_workers_under_srun_do_not_see_the_daemons_slurm_task(job, slurm):
    """The daemons run as one-task srun steps: SLURM_PROCID=0, SLURM_NTASKS=1, ... are
    theirs. Workers that saw them would take Slurm for their launcher (Lightning: every
    worker rank 0 of 1); they keep the job's variables."""
    env = slurm_env(job, slurm)
    r = subprocess.run(["salloc", "-N3", str(ELASTICRUN), "/usr/bin/env"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    envs = worker_environments(r.stdout)
    assert sorted(envs) == [0, 1, 2], r.stdout[-3000:]
    for rank, e in envs.items():
        assert e.get("SLURM_JOB_ID") and e.get("SLURM_JOB_NODELIST") == "er-h[1-3]", (rank, e)
        assert not [v for v in TASK_VARIABLES if v in e], (rank, e)
    # The daemons' own environment had them: what is checked above was taken away.
    steps = subprocess.run(["salloc", "-N1", "srun", "--overlap", "-N1", "/usr/bin/env"], capture_output=True,
                           text=True, env=env, timeout=60)
    assert "SLURM_PROCID=0" in steps.stdout and "SLURM_NTASKS=1" in steps.stdout, steps.stdout


def test_slurm_task_variables_of_the_driver_are_not_the_workers_but_x_sets_them(job):
    """The driver's node's daemon inherits the batch step's task variables: dropped too;
    -x NAME=VALUE still sets one."""
    r = job.run(["-np", 2, "-x", "SLURM_NODEID=9", "/usr/bin/env"], timeout=60,
                env={"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "2", "SLURM_CPU_BIND": "none",
                     "SLURM_JOB_NAME": "train"})
    assert r.returncode == 0, r.stderr
    envs = worker_environments(r.stdout)
    assert envs == {0: {"SLURM_JOB_NAME": "train", "SLURM_NODEID": "9"},
                    1: {"SLURM_JOB_NAME": "train", "SLURM_NODEID": "9"}}, envs
