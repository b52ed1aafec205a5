"""A network you can shape (scripts/testcluster's --rate, --loss, --delay on each host's link,
both ways): the shaping is really applied (a timed TCP transfer runs at the shaped rate in
each direction, unshaped it is several times faster, so the link and not the CPU is the
bound; a shaped loss drops that share of datagrams), bad shapes are refused, and every
collective and algorithm of the library (examples/allreduce_check over UCX's TCP transport,
two ranks per host: ring, recursive doubling, hierarchical) stays correct on lossy,
rate-limited links and with one link a tenth of the others' rate, and an elastic job whose
host's cable is cut on the lossy network drops that host within --host-timeout and
finishes with the reference model.

This module's cluster is made without a delay: --delay needs the kernel's netem there, and
this machine's kernel has none (`tc qdisc add ... netem` answers "qdisc kind unknown"), nor
fq, gact or police; `shape --delay` then exits 77 and says how to get a delay (a cluster
made with one carries the userspace delay line: test_delayed_network.py)."""
import re
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLES, discovery_script, namespace_cluster, wait_for_progress
from conftest import cluster_addr as addr, run_testcluster as tc, shape_link as shape
from test_sgd import finals, reference

N = 3

RECEIVER = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[3])))
if sys.argv[1] == "tcp":
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    n, t0 = 0, None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        t0 = t0 or time.monotonic()
        n += len(b)
    print(n, time.monotonic() - t0, flush=True)
else:
    # Room for every datagram (a busy machine may stall this reader while they come, and
    # an overflow would count as loss), and no end before the first: the sender is a
    # fresh interpreter still starting. Then 1.5 s without one ends it.
    try:
        s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root), which Python does not name
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    s.settimeout(60)
    print("ready", flush=True)
    n = 0
    try:
        while True:
            s.recv(4096)
            n += 1
            s.settimeout(1.5)
    except socket.timeout:
        pass
    print(n, flush=True)
"""

SENDER = r"""
import socket, sys, time
kind, addr, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "tcp":
    s = socket.create_connection((addr, port))
    buf = b"x" * (1 << 16)
    for _ in range(count // len(buf)):
        s.sendall(buf)
    s.close()
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(count):
        s.sendto(b"y" * 1000, (addr, port))
        time.sleep(0.0002)
"""


@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(N, 2)


@pytest.fixture
def unshaped(cluster):
    """Every link unshaped before and after the test."""
    for k in range(1, N + 1):
        shape(k)
    yield cluster
    for k in range(1, N + 1):
        tc("link", k, "shape")


def transfer(src, dst, kind, amount, port):
    """Sends `amount` bytes (tcp) or datagrams (udp) from host src to host dst; returns the
    receiver's report: (bytes, seconds) or (datagrams,)."""
    rx = subprocess.Popen(["ip", "netns", "exec", f"er-h{dst}", sys.executable, "-c", RECEIVER, kind, addr(dst),
                           str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", f"er-h{src}", sys.executable, "-c", SENDER, kind, addr(dst), str(port),
                        str(amount)], check=True, timeout=120)
        out, _ = rx.communicate(timeout=60)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    return tuple(float(x) for x in out.split())


def mbit_per_s(src, dst, amount, port):
    n, seconds = transfer(src, dst, "tcp", amount, port)
    assert n == amount
    return n * 8 / seconds / 1e6


def test_a_shaped_link_carries_its_rate_each_way_and_unshaped_is_far_faster(unshaped):
    """Host 2's link at 40 Mbit/s: TCP from 1 to 2 and from 2 to 1 each run at 85-100 % of
    it (headers take a few percent); the same transfer unshaped is at least 4x faster, so
    at 40 Mbit/s the link is the bound, not the CPU."""
    shape(2, "--rate", "40mbit")
    assert "rate 40mbit" in tc("link", 2, "show").stdout
    amount = 5 << 20  # about 1 s at the rate
    there = mbit_per_s(1, 2, amount, 5101)
    back = mbit_per_s(2, 1, amount, 5102)
    assert 34 <= there <= 40.5 and 34 <= back <= 40.5, (there, back)
    shape(2)
    assert "unshaped" in tc("link", 2, "show").stdout
    free = mbit_per_s(1, 2, 8 * amount, 5103)
    assert free >= 4 * 40, free
    print(f"shaped 40mbit: {there:.1f} / {back:.1f} Mbit/s each way; unshaped {free:.0f} Mbit/s")


def test_a_shaped_loss_drops_its_share_each_way(unshaped):
    """--loss 20% on host 2's link: of 3000 datagrams from host 1 (whose link is unshaped)
    about 80 % arrive, and as many the other way (binomial: 6 sigma is about 4.4 %)."""
    shape(2, "--loss", "20%")
    for src, dst, port in ((1, 2, 5201), (2, 1, 5202)):
        (got,) = transfer(src, dst, "udp", 3000, port)
        assert 0.75 <= got / 3000 <= 0.85, (src, dst, got)


def test_bad_shapes_are_refused(cluster):
    for args, want in [(["--rate", "10xbit"], "--rate '10xbit': expected"),
                       (["--loss", "101%"], "--loss '101%': expected a percentage"),
                       (["--delay", "5"], "--delay '5': expected N(us|ms|s)"),
                       (["--jitter", "1ms"], "--jitter needs --delay"),
                       (["--bogus"], "unknown argument '--bogus'")]:
        r = tc("link", 1, "shape", *args)
        assert r.returncode == 1 and want in r.stderr, (args, r.returncode, r.stderr)
    r = tc("link", 9, "shape", "--rate", "1mbit")
    assert r.returncode == 1 and "no host '9'" in r.stderr, r.stderr


def test_a_delay_needs_netem_or_a_cluster_made_with_the_delay_line(unshaped):
    """This cluster was made without a delay (so without the delay line): where the kernel
    has netem, --delay is applied; where it has none, it exits 77 and says how to get one
    (test_delayed_network.py tests the delay line)."""
    r = tc("link", 2, "shape", "--delay", "20ms")
    if r.returncode == 77:
        assert "netem" in r.stderr and "up N --delay D" in r.stderr, r.stderr
        assert "unshaped" in tc("link", 2, "show").stdout
        return
    assert r.returncode == 0, r.stderr
    # A TCP connect takes a round trip: host 2's link is crossed once each way, 20 ms each.
    code = ("import socket,time\nt=time.monotonic()\nsocket.create_connection(('%s', 22)).close()\n"
            "print(time.monotonic()-t)" % addr(2))
    rtt = float(subprocess.run(["ip", "netns", "exec", "er-h1", sys.executable, "-c", code], capture_output=True,
                               text=True, check=True).stdout)
    assert 0.035 <= rtt <= 0.2, rtt


# allreduce_check's large case: 256 KiB (not its 2 MiB) keeps the runs short (every type,
# op and algorithm: some 1,200 collectives); it still spans many TCP segments, each of which
# the loss may take. Six ranks share two cores: they wait blocked, not busy-polling (which
# made the same check 10x slower).
LARGE = 256 << 10


def run_check(job, cluster, large=LARGE, timeout=300, layout=(2,) * N):
    """allreduce_check on hosts 1.. with `layout` ranks each."""
    directory, env = cluster
    hosts = ",".join(f"{addr(k)}:{ranks}" for k, ranks in enumerate(layout, 1))
    return job.run(["-x", "UCX_TLS=tcp,self", "-x", "ELASTICRUN_PROGRESS=block", "-x", "ER_TEST_TAG", "-np", sum(layout), "-H", hosts,
                    EXAMPLES / "allreduce_check", "--large", large], env=env, timeout=timeout)


def test_every_collective_is_correct_on_lossy_rate_limited_links(job, unshaped):
    """1 % loss each way on every link (a packet between hosts is lost with about 2 %), at
    200 Mbit/s: TCP retransmits, and every collective of every algorithm still checks, on
    hosts of 2, 2 and 1 ranks (as an elastic job runs after losing a worker: the
    hierarchical collectives with a host of one rank and hosts' parts of different sizes)."""
    for k in range(1, N + 1):
        shape(k, "--rate", "200mbit", "--loss", "1%")
    r = run_check(job, unshaped, layout=(2, 2, 1))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "algorithms: ring rd rhd direct twoshot hier" in r.stdout, r.stdout[-2000:]
    assert re.search(r"allreduce_check: OK \(\d+ checks\)", r.stdout), r.stdout[-2000:]


def test_every_collective_is_correct_with_one_slow_link(job, unshaped):
    """Host 3's link at a tenth of the others' rate (20 against 200 Mbit/s); the large case
    is 64 KiB, as at 256 KiB the slow link alone takes 100 s."""
    for k in range(1, N + 1):
        shape(k, "--rate", "20mbit" if k == 3 else "200mbit")
    r = run_check(job, unshaped, large=64 << 10)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "algorithms: ring rd rhd direct twoshot hier rails" in r.stdout, r.stdout[-2000:]  # hosts of 2 ranks each
    assert re.search(r"allreduce_check: OK \(\d+ checks\)", r.stdout), r.stdout[-2000:]


def test_a_cut_cable_on_the_lossy_network_drops_the_host_and_the_job_goes_on(job, unshaped, tmp_path):
    """Every link at 200 Mbit/s with 1 % loss each way; an elastic elastic_sgd on the three
    hosts (one worker each); host 3's cable cut mid-training: the driver drops the host
    after --host-timeout (3 s) of silence, not before and not much after, and the two
    others finish with the model of an uninterrupted run."""
    for k in range(1, N + 1):
        shape(k, "--rate", "200mbit", "--loss", "1%")
    _, env = unshaped
    _, discover = discovery_script(tmp_path, [f"{addr(k)}:1" for k in range(1, N + 1)])
    ev, progress = tmp_path / "events", tmp_path / "progress"
    args = ["--steps", 300, "--dim", 64, "--batch", 48, "--commit-every", 5]
    p = job.start(["-x", "UCX_TLS=tcp,self", "-x", "ELASTICRUN_PROGRESS=block", "-x", "ER_TEST_TAG", "-x",
                   "ELASTICRUN_COLLECTIVE_TIMEOUT", "--min-np", 2, "--host-discovery-script", discover,
                   "--host-timeout", 3, "--events", ev, EXAMPLES / "elastic_sgd", *args, "--step-ms", 20,
                   "--progress-file", progress], env=env)
    try:
        wait_for_progress(progress, 60, p)
        assert tc("link", 3, "down").returncode == 0
        cut = time.monotonic()
        dropped = None
        while time.monotonic() < cut + 20 and dropped is None:
            if any(e["event"] == "host_blacklisted" and e["host"] == addr(3) for e in job.events(ev)):
                dropped = time.monotonic() - cut
            time.sleep(0.05)
    finally:
        tc("link", 3, "up")
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-3000:]
    assert dropped is not None and 2 < dropped < 10, (dropped, err[-2000:])
    assert finals(out) == [reference(args)] * 2, out[-2000:]
    print(f"cut cable on the lossy network: host dropped {dropped:.2f} s after the cut")


def test_allreduce_check_refuses_a_bad_large_size():
    for args in (["--large", "12"], ["--large", "2x"], ["--large"], ["--bogus", "1"]):
        r = subprocess.run([str(EXAMPLES / "allreduce_check"), *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "allreduce_check: --large wants" in r.stderr or "usage: allreduce_check" in r.stderr, (args, r.stderr)
