"""--request-hosts-script on loopback hosts: a request script that "obtains" hosts by adding
them to the file the discovery script prints (as a Slurm or cloud version would make them
appear in discovery) and gives them back by removing them. The job grows to --max-np by
asking, gives back the hosts it does not use, and goes on when the script fails."""
import time

from conftest import EXAMPLES, job  # noqa: F401 (job: a fixture)
from test_sgd import finals, reference

SGD = EXAMPLES / "elastic_sgd"

REQUEST = """#!/bin/bash
# request N: add N hosts from the pool; release H...: remove them. Logs every call.
echo "$*" >> {log}
case "$1" in
  request) for h in 127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5; do
             [ "$2" -gt 0 ] || break
             grep -q "^$h:" {hosts} || {{ echo "$h:1" >> {hosts}; set -- request $(($2 - 1)); }}
           done ;;
  release) shift; for h in "$@"; do sed -i "/^$h:/d" {hosts}; done ;;
esac
{extra}
"""


def make_scripts(tmp_path, hosts, extra=""):
    hosts_file, log = tmp_path / "hosts", tmp_path / "calls"
    hosts_file.write_text("".join(h + "\n" for h in hosts))
    disc = tmp_path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    req = tmp_path / "request.sh"
    req.write_text(REQUEST.format(log=log, hosts=hosts_file, extra=extra))
    for s in (disc, req):
        s.chmod(0o755)
    return hosts_file, log, disc, req


def run_job(job, tmp_path, disc, req, max_np, sgd_args, interval=1):
    ev = tmp_path / "events"
    r = job.run(["--min-np", 1, "--max-np", max_np, "--host-discovery-script", disc, "--discovery-interval", 0.2,
                 "--request-hosts-script", req, "--request-interval", interval, "--events", ev, SGD, *sgd_args],
                timeout=180)
    return r, job.events(ev)


def test_job_asks_for_slots_up_to_max_np_and_grows(job, tmp_path):
    """One slot offered, --max-np 3: the script is asked for 2 and adds two hosts; the job
    grows to 3 workers without a restart and ends with the reference model."""
    hosts, log, disc, req = make_scripts(tmp_path, ["localhost:1"])
    args = ["--steps", 400, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 15]
    r, events = run_job(job, tmp_path, disc, req, 3, args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert log.read_text().splitlines()[0] == "request 2", log.read_text()
    asked = [e for e in events if e["event"] == "hosts_requested"]
    assert asked and asked[0]["slots"] == 2, events
    sizes = [e["size"] for e in events if e["event"] == "epoch_started"]
    assert sizes[0] == 1 and 3 in sizes, sizes
    assert finals(r.stdout) == [reference(args)] * 3, r.stdout[-2000:]


def test_hosts_the_job_does_not_use_are_given_back(job, tmp_path):
    """Four hosts offered, --max-np 2: the two without workers are released after the
    interval, and only those."""
    hosts, log, disc, req = make_scripts(tmp_path, ["localhost:1", "127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1"])
    args = ["--steps", 300, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 15]
    r, events = run_job(job, tmp_path, disc, req, 2, args)
    assert r.returncode == 0, r.stderr[-3000:]
    first = [e for e in events if e["event"] == "epoch_started"][0]
    used = {w["host"] for w in first["assignment"]}
    released = [e for e in events if e["event"] == "hosts_released"]
    assert released, events
    assert set(released[0]["hosts"]) == {"localhost", "127.0.0.2", "127.0.0.3", "127.0.0.4"} - used, (released, used)
    assert f"release {' '.join(released[0]['hosts'])}" in log.read_text().splitlines()
    assert len(hosts.read_text().splitlines()) == 2, hosts.read_text()
    assert not any(e["event"] == "hosts_requested" for e in events), "asked for slots at --max-np"


def test_a_failing_script_is_logged_and_retried_but_never_ends_the_job(job, tmp_path):
    hosts, log, disc, req = make_scripts(tmp_path, ["localhost:1"], extra='echo "no quota left" >&2; exit 3')
    args = ["--steps", 250, "--dim", 64, "--batch", 48, "--commit-every", 10, "--step-ms", 20]
    start = time.monotonic()
    r, events = run_job(job, tmp_path, disc, req, 2, args)
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr[-3000:]
    failed = [e for e in events if e["event"] == "request_failed"]
    assert failed and "request-hosts script exited with code 3: no quota left" in failed[0]["message"], events
    assert "no quota left" in r.stderr and "the job goes on" in r.stderr
    # at most one run per interval (1 s): no storm of retries
    calls = log.read_text().splitlines()
    assert 1 <= len(calls) <= took + 1, (calls, took)
