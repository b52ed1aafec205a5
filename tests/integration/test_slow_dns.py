"""The driver's name lookups run off its I/O thread: a host whose DNS answer takes seconds
stalls no heartbeat. The driver runs in a network and mount namespace of its own whose
/etc/resolv.conf names a real DNS server (slow_dns.py) that answers every query after
3 s; the local daemon gives the driver up after --host-timeout (1.5 s) without a word
from it. A discovered host's name goes through that server while the job runs: were it
looked up on the I/O thread, the local daemon would stop its workers and the job fail."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ELASTICRUN, TESTPROG, requires
from conftest import discovery_script as discovery

HERE = Path(__file__).resolve().parent
DELAY = 3.0

pytestmark = requires("netns", os.geteuid() != 0 or not shutil.which("unshare"),
                      "needs root and unshare(1) for a namespace with its own /etc/resolv.conf")


def run_in_slow_dns_namespace(job, tmp_path, args, timeout=90):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:10\n")
    log, ready = tmp_path / "dns.log", tmp_path / "dns.ready"
    script = tmp_path / "in-namespace.sh"
    script.write_text(f"""set -u
ip link set lo up
mount --bind {resolv} /etc/resolv.conf
/usr/bin/python3 {HERE / 'slow_dns.py'} --delay {DELAY} --log {log} --ready {ready} &
dns=$!
for i in $(seq 100); do [ -e {ready} ] && break; sleep 0.05; done
"$@"
rc=$?
kill $dns; wait $dns 2>/dev/null
exit $rc
""")
    r = subprocess.run(["unshare", "--net", "--mount", "bash", str(script), str(ELASTICRUN), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, env=job.env())
    queries = [l.split() for l in log.read_text().splitlines()] if log.exists() else []
    return r, queries


def test_slow_name_lookup_stalls_no_heartbeat(job, tmp_path):
    ev = tmp_path / "events"
    slow = "slowhost.elasticrun.test"
    _, script = discovery(tmp_path, ["localhost:2", f"{slow}:1"])
    r, queries = run_in_slow_dns_namespace(job, tmp_path, [
        "-np", 2, "--min-np", 2, "--max-np", 3, "--host-discovery-script", script, "--host-timeout", "1.5",
        "--elastic-timeout", 30, "--events", ev, TESTPROG, "--elastic", "--allreduce-seconds", 3])
    assert r.returncode == 0, r.stdout + r.stderr
    # The slow server was really asked about the host, and really took its time.
    asked = [q for q in queries if q[2].startswith(slow)]
    assert asked, queries
    assert all(float(q[1]) - float(q[0]) >= DELAY - 0.1 for q in asked), asked
    events = job.events(ev)
    failed = [e for e in events if e["event"] == "host_blacklisted" and e.get("host") == slow]
    assert failed and "cannot resolve" in failed[0].get("reason", ""), events
    assert "no word from the driver" not in r.stderr
    assert r.stdout.count("done after") == 2, r.stdout
