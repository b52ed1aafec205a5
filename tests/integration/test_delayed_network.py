"""Latency on the shaped network: scripts/testcluster's --delay and --jitter on a cluster made
with them (`up 3 --delay 0us`). Where the kernel has netem, netem delays; where it has none
(this machine), the userspace delay line (tests/progs/delayline.cc) sits in every host's
link. Either way: a delay is applied on each direction of the link it is set on (a TCP
round trip is never faster than the delays it crosses, and not much slower), jitter spreads
the round trips without dropping under the delay's floor, unshaped the line costs little,
every collective and algorithm of the library stays correct on links that are at once
delayed, jittery, lossy and rate-limited, and the library's tuner (host/tuner.h) measures
the delay: it picks the algorithms with fewer rounds, the same on every rank. Bad delay
settings and a bad delay-line configuration are refused with their reason."""
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest

from conftest import BUILD, EXAMPLES, namespace_cluster
from conftest import cluster_addr as addr, run_testcluster as tc, shape_link as shape

N = 3

# A TCP ping-pong of one byte (TCP_NODELAY): the server echoes, the client prints each round
# trip in microseconds.
PINGPONG = r"""
import socket, sys, time
role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "server":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(64)):
        c.sendall(b)
else:
    c = socket.create_connection((addr, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(int(sys.argv[4])):
        t = time.perf_counter()
        c.sendall(b"x")
        c.recv(64)
        print(round((time.perf_counter() - t) * 1e6))
"""


@pytest.fixture(scope="module")
def cluster():
    yield from namespace_cluster(N, 2, "--delay", "0us")


@pytest.fixture
def undelayed(cluster):
    """Every link unshaped (delay 0) before and after the test."""
    for k in range(1, N + 1):
        shape(k)
    yield cluster
    for k in range(1, N + 1):
        tc("link", k, "shape")


def round_trips_us(src, dst, count, port):
    """`count` TCP round trips from host src to host dst, in microseconds, sorted."""
    server = subprocess.Popen(["ip", "netns", "exec", f"er-h{dst}", sys.executable, "-c", PINGPONG, "server", addr(dst),
                               str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        out = subprocess.run(["ip", "netns", "exec", f"er-h{src}", sys.executable, "-c", PINGPONG, "client", addr(dst),
                              str(port), str(count)], capture_output=True, text=True, check=True, timeout=120).stdout
    finally:
        server.kill()
        server.wait()
    return sorted(int(x) for x in out.split())


def test_a_delay_is_applied_each_way_of_its_link(undelayed):
    """Host 2's link delayed 2 ms: a round trip from host 1 crosses it once each way, so no
    round trip takes under 4 ms, and the median is within 1.5 ms of it. With host 1's link
    at 1 ms as well, 6 ms. Undelayed, the same round trip is far under 1 ms."""
    free = statistics.median(round_trips_us(1, 2, 200, 5301))
    shape(2, "--delay", "2ms")
    show = tc("link", 2, "show").stdout
    assert "delay 2ms" in show, show
    two = round_trips_us(1, 2, 100, 5302)
    shape(1, "--delay", "1ms")
    three = round_trips_us(1, 2, 100, 5303)
    print(f"round trip: undelayed median {free} us; host 2 at 2 ms: min {two[0]} median {statistics.median(two)} us; "
          f"and host 1 at 1 ms: min {three[0]} median {statistics.median(three)} us")
    assert free < 1000, free
    assert two[0] >= 4000 and statistics.median(two) <= 5500, two
    assert three[0] >= 6000 and statistics.median(three) <= 7500, three


def test_jitter_spreads_the_round_trips_above_the_floor(undelayed):
    """--delay 2ms --jitter 1ms on host 2's link: each crossing takes 1-3 ms, so a round trip
    takes 2-6 ms (median about 4); p10 to p90 of 150 round trips spans more than 1 ms,
    where an unjittered delay keeps them within a few hundred microseconds."""
    shape(2, "--delay", "2ms", "--jitter", "1ms")
    rtt = round_trips_us(1, 2, 150, 5304)
    p10, p90 = rtt[len(rtt) // 10], rtt[len(rtt) * 9 // 10]
    print(f"jittered round trips: min {rtt[0]} p10 {p10} median {statistics.median(rtt)} p90 {p90} us")
    assert rtt[0] >= 2000, rtt
    assert 3000 <= statistics.median(rtt) <= 5500, rtt
    assert p90 - p10 >= 1000, rtt


# One round trip on request: connects, says "connected", then on a line from stdin sends a
# byte, waits for the echo, and prints the send and receive times (CLOCK_MONOTONIC, which
# every namespace shares).
ONE_ROUND_TRIP = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
print("connected", flush=True)
sys.stdin.readline()
sent = time.monotonic()
c.sendall(b"x")
c.recv(64)
print(sent, time.monotonic(), flush=True)
"""


def test_a_frame_that_waits_for_the_line_is_delayed_from_its_arrival(undelayed):
    """The delay line holds a frame for its link's delay from when the kernel stamped it on
    arrival, not from when the line got round to reading it (a busy line would add its own
    lag to every delay). Host 1's link at 50 ms, and the line stopped (SIGSTOP) while host 1
    sends one byte to host 2: when the line runs again 300 ms later, the byte has waited
    longer than its delay and leaves at once, and only the echo's crossing of host 1's link,
    50 ms, remains. A line that timed the byte from reading it would take 100 ms."""
    directory, _ = undelayed
    if not (directory / "delayline.conf").exists():
        pytest.skip("this cluster delays with netem, not with the delay line")
    line = subprocess.run(["pgrep", "-x", "delayline"], capture_output=True, text=True).stdout.split()
    assert len(line) == 1, line
    shape(1, "--delay", "50ms")
    server = subprocess.Popen(["ip", "netns", "exec", "er-h2", sys.executable, "-c", PINGPONG, "server", addr(2), "5305"],
                              stdout=subprocess.PIPE, text=True)
    client = None
    try:
        assert server.stdout.readline().strip() == "ready"
        client = subprocess.Popen(["ip", "netns", "exec", "er-h1", sys.executable, "-c", ONE_ROUND_TRIP, addr(2), "5305"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "connected"
        os.kill(int(line[0]), signal.SIGSTOP)
        try:
            client.stdin.write("go\n")
            client.stdin.flush()
            time.sleep(0.3)
        finally:
            resumed = time.monotonic()
            os.kill(int(line[0]), signal.SIGCONT)
        out, _ = client.communicate(timeout=10)  # the round trip, or a failure here, never a hang
        sent, received = map(float, out.split())
    finally:
        for p in (server, client):
            if p:
                p.kill()
                p.wait()
    after = (received - resumed) * 1e3
    print(f"sent {(resumed - sent) * 1e3:.1f} ms before the line ran again; the echo came {after:.1f} ms after")
    assert resumed - sent >= 0.25, (sent, resumed)
    assert 50 <= after < 95, after  # timed from reading it: 100 ms


def test_bad_delays_are_refused(undelayed):
    """The delay line keeps a direction in order, so it takes a jitter of at most the delay
    (netem takes any)."""
    directory, _ = undelayed
    r = tc("link", 1, "shape", "--delay", "1ms", "--jitter", "2ms")
    if (directory / "delayline.conf").exists():
        assert r.returncode == 1 and "a jitter of at most the delay" in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stderr
    r = tc("link", 1, "shape", "--delay", "soon")
    assert r.returncode == 1 and "--delay 'soon': expected N(us|ms|s)" in r.stderr, r.stderr


def test_the_delay_line_refuses_a_bad_configuration(tmp_path):
    line = BUILD / "tests" / "delayline"
    r = subprocess.run([str(line)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "usage: delayline CONFIG" in r.stderr, r.stderr
    conf = tmp_path / "conf"
    for text, want in [("er-x1 er-y1 1000\n", "expected 'DEV_A DEV_B DELAY_NS JITTER_NS'"),
                       ("er-x1 er-y1 1000 2000\n", "0 <= jitter <= delay"),
                       ("# generation 1\n", "no links in"),
                       ("no-such-dev0 no-such-dev1 0 0\n", "no device 'no-such-dev0'")]:
        conf.write_text(text)
        r = subprocess.run([str(line), str(conf)], capture_output=True, text=True, timeout=10)
        assert r.returncode == 1 and want in r.stderr, (text, r.returncode, r.stderr)
    r = subprocess.run([str(line), str(tmp_path / "missing")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "cannot read" in r.stderr, r.stderr


def test_every_collective_is_correct_on_delayed_jittery_lossy_links(job, undelayed):
    """Every link at 100 Mbit/s, 500 us +- 100 us each way, 1 % loss each way: every
    collective of every algorithm of allreduce_check (two ranks per host) still checks."""
    for k in range(1, N + 1):
        shape(k, "--rate", "100mbit", "--delay", "500us", "--jitter", "100us", "--loss", "1%")
    _, env = undelayed
    hosts = ",".join(f"{addr(k)}:2" for k in range(1, N + 1))
    r = job.run(["-x", "UCX_TLS=tcp,self", "-x", "ELASTICRUN_PROGRESS=block", "-x", "ER_TEST_TAG", "-np", 2 * N, "-H", hosts,
                 EXAMPLES / "allreduce_check", "--large", 64 << 10], env=env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"allreduce_check: OK \(\d+ checks\)", r.stdout), r.stdout[-2000:]


def tuned_lines(stderr):
    """The tuner's decisions as each rank logged them: {rank: [text, ...]}."""
    out = {}
    for m in re.finditer(r"^\[(\d+)\]<stderr>: .*? tuned (.*)$", stderr, re.M):
        out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def test_the_tuner_measures_the_delayed_network_and_every_rank_agrees(job, undelayed):
    """2 ms each way on every link (an exchange between hosts takes 4 ms one way): where
    the fixed crossovers pick recursive halving-doubling (an allreduce of 8-16 KiB), the
    tuner measures it, recursive doubling (3 exchanges among 3 hosts) and direct (one) on
    the first calls and keeps direct; where they pick scatter-allgather (a broadcast of as
    much), it measures it against the binomial tree (among 3 hosts also the direct
    broadcast: the root sends to both) and keeps the tree; an allgather or reduce-scatter
    of 16 KiB (Bruck's, the halving one: 2 exchanges among 3, as the ring's) goes direct
    (one). Every rank logs the same decisions. Each winner ran a second round against the fixed choice, and won it
    too. ELASTICRUN_TUNE=0 keeps the fixed choice (nothing tuned)."""
    for k in range(1, N + 1):
        shape(k, "--delay", "2ms")
    _, env = undelayed
    hosts = ",".join(f"{addr(k)}:1" for k in range(1, N + 1))
    bench = BUILD / "bench" / "allreduce_bench"
    for collective, candidates in (("allreduce", ("rhd", "rd", "direct")), ("broadcast", ("scatter-allgather", "binomial")),
                                   ("allgather", ("bruck", "ring", "direct")),
                                   ("reduce_scatter", ("halving", "ring", "direct"))):
        # 4 warm-up calls and 40 timed: the class's 25 trial calls, 14 confirming, and then some
        r = job.run(["-x", "UCX_TLS=tcp,self", "-x", "ELASTICRUN_LOG_LEVEL=info", "-np", N, "-H", hosts, bench,
                     "--collective", collective, "--min-bytes", "16K", "--max-bytes", "16K", "--iters", 40,
                     "--warmup", 4], env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = tuned_lines(r.stdout + r.stderr)
        assert sorted(lines) == list(range(N)), r.stderr[-3000:]
        assert all(v == lines[0] for v in lines.values()), lines
        assert len(lines[0]) == 1 and lines[0][0].startswith(f"{collective} of 8193-16384 bytes over {N} ranks"), lines
        first, _, again = lines[0][0].partition("; again ")
        names = re.findall(r"(?:: |, )([a-z-]+) \d+ us", first)
        assert tuple(names) == candidates and lines[0][0].endswith(f": {candidates[-1]}"), lines
        assert re.fullmatch(rf"{candidates[-1]} \d+ us, {candidates[0]} \d+ us: {candidates[-1]}", again), lines
        r = job.run(["-x", "UCX_TLS=tcp,self", "-x", "ELASTICRUN_LOG_LEVEL=info", "-x", "ELASTICRUN_TUNE=0", "-np", N,
                     "-H", hosts, bench, "--collective", collective, "--min-bytes", "16K", "--max-bytes", "16K",
                     "--iters", 15, "--warmup", 4], env=env, timeout=120)
        assert r.returncode == 0 and not tuned_lines(r.stderr), r.stderr[-3000:]


def test_the_benchmark_warms_each_size_up_past_the_tuners_trials(job, undelayed):
    """bench/allreduce_bench's warm-up (its CSV's last column) covers the calls the library's
    tuner may spend on a size class (Communicator::tuning_calls(), 60) even where the byte
    budget would cut it to 1-3 calls, so the timed calls run the tuner's choice: every size
    has its decision logged. --warmup N still sets it, and where the library does not tune
    (ELASTICRUN_TUNE=0) the budget cuts it as it does for Open MPI and Gloo."""
    _, env = undelayed
    hosts = ",".join(f"{addr(k)}:1" for k in range(1, N + 1))
    sweep = [BUILD / "bench" / "allreduce_bench", "--csv", "--min-bytes", "16K", "--max-bytes", "64K", "--budget", "256K",
             "--iters", 5]

    def warmups(*extra, tune="1"):
        r = job.run(["-x", "UCX_TLS=tcp,self", "-x", "ELASTICRUN_LOG_LEVEL=info", "-x", f"ELASTICRUN_TUNE={tune}", "-np", N,
                     "-H", hosts, *sweep, *extra], env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        rows = [line.split(": ", 1)[1].split(",") for line in r.stdout.splitlines() if line.startswith("[0]<stdout>: ")]
        assert rows[0][-1] == "warmup" and len(rows) == 4, r.stdout
        assert all(row[10] == "yes" for row in rows[1:]), r.stdout
        return {int(row[2]): int(row[-1]) for row in rows[1:]}, tuned_lines(r.stderr)

    got, lines = warmups()
    assert got == {16384: 60, 32768: 60, 65536: 60}, got
    assert sorted(lines) == list(range(N)) and [t.split(" over ")[0] for t in lines[0]] == [
        "allreduce of 8193-16384 bytes", "allreduce of 16385-32768 bytes", "allreduce of 32769-65536 bytes"], lines
    got, _ = warmups("--warmup", 4)
    assert got == {16384: 4, 32768: 4, 65536: 4}, got
    got, lines = warmups(tune="0")
    assert got == {16384: 3, 32768: 1, 65536: 1} and not lines, (got, lines)
