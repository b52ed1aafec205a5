"""The network-namespace test cluster (scripts/testcluster): hosts, their sshds, reachability,
link cuts, and a clean `down`. Skips with the script's reason where namespaces cannot be made
(fails instead with ELASTICRUN_TEST_REQUIRE=netns, see conftest.py).

The `cluster` fixture and the `Cluster` helper are meant to move to conftest.py once the SSH
launch tests use them."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import skip_unless_required

ROOT = Path(__file__).resolve().parents[2]
TESTCLUSTER = ROOT / "scripts" / "testcluster"
NET = os.environ.get("TESTCLUSTER_NET", "10.77.0")
DRIVER_ADDR = f"{NET}.1"
N = 3
SLOTS = 2


def addr(k):
    return f"{NET}.{10 + k}"


def tc(*args, timeout=60, check=False):
    return subprocess.run([str(TESTCLUSTER), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=check)


class Cluster:
    def __init__(self, directory):
        self.dir = Path(directory)
        self.ssh_config = self.dir / "ssh_config"
        self.discover = self.dir / "discover"
        self.hosts = [addr(k) for k in range(1, N + 1)]

    def ssh(self, host, *cmd, extra=(), timeout=20):
        return subprocess.run(["ssh", "-F", str(self.ssh_config), *extra, f"root@{host}", *cmd],
                              capture_output=True, text=True, timeout=timeout)

    def exec_py(self, k, code, timeout=20):
        """Run Python code inside host k's namespace."""
        return tc("exec", k, sys.executable, "-c", code, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    r = tc("up", N, "--slots", SLOTS, timeout=120)
    if r.returncode == 77:
        skip_unless_required("netns", r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "testcluster: exit 77")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("CLUSTER_DIR="), r.stdout
    c = Cluster(lines[0].split("=", 1)[1])
    try:
        yield c
    finally:
        tc("down", timeout=60)


def can_connect(host, port, timeout=1.0):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(pred, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_cluster_dir_contents(cluster):
    d = cluster.dir
    for name in ("env", "known_hosts", "ssh_config", "discover", "hosts", "id_ed25519"):
        assert (d / name).is_file(), name
    assert os.access(d / "discover", os.X_OK)
    env = (d / "env").read_text()
    for var in ("ELASTICRUN_SSH_KEY", "ELASTICRUN_SSH_KNOWN_HOSTS", "ELASTICRUN_SSH_CONFIG",
                "ELASTICRUN_TESTCLUSTER_HOSTS", "ELASTICRUN_TESTCLUSTER_DRIVER_ADDR"):
        assert f"export {var}=" in env, var
    # Sourcing it in a shell gives the documented values.
    out = subprocess.run(["bash", "-c", f". {d}/env && echo $ELASTICRUN_SSH_KEY "
                          "$ELASTICRUN_TESTCLUSTER_DRIVER_ADDR $ELASTICRUN_TESTCLUSTER_HOSTS"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(d / "id_ed25519"), DRIVER_ADDR, *cluster.hosts]
    known = [l.split()[0] for l in (d / "known_hosts").read_text().splitlines() if l.strip()]
    assert known == cluster.hosts


def test_discover_lists_hosts(cluster):
    out = subprocess.run([str(cluster.discover)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [f"{h}:{SLOTS}" for h in cluster.hosts]
    assert (cluster.dir / "hosts").read_text().splitlines() == out.splitlines()


def test_ssh_to_every_host(cluster):
    with ThreadPoolExecutor(len(cluster.hosts)) as pool:
        results = list(pool.map(lambda h: cluster.ssh(h, "hostname; echo $SSH_CONNECTION"),
                                cluster.hosts))
    for k, r in enumerate(results, start=1):
        assert r.returncode == 0, r.stderr
        name, conn = r.stdout.splitlines()
        assert name == f"er-h{k}"
        # The session runs on host k, and the driver side is the root's bridge address.
        client_ip, _, server_ip, server_port = conn.split()
        assert (client_ip, server_ip, server_port) == (DRIVER_ADDR, addr(k), "22")


def test_wrong_host_key_is_refused(cluster):
    lines = (cluster.dir / "known_hosts").read_text().splitlines()
    # Host 2's key recorded under host 1's address: a key mismatch.
    key2 = lines[1].split(None, 1)[1]
    with tempfile.NamedTemporaryFile("w", suffix=".known_hosts") as f:
        f.write(f"{cluster.hosts[0]} {key2}\n")
        f.flush()
        r = cluster.ssh(cluster.hosts[0], "true", extra=("-o", f"UserKnownHostsFile={f.name}"))
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr
    # No entry at all, with strict checking: refused too.
    r = cluster.ssh(cluster.hosts[0], "true", extra=("-o", "UserKnownHostsFile=/dev/null"))
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


def test_hosts_reach_each_other_and_the_root(cluster):
    lsock = socket.socket()
    lsock.bind((DRIVER_ADDR, 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    try:
        for k in range(1, N + 1):
            targets = [(DRIVER_ADDR, port)] + [(h, 22) for h in cluster.hosts if h != addr(k)]
            code = (
                "import socket\n"
                f"for t in {targets!r}:\n"
                "    socket.create_connection(t, timeout=2).close()\n"
                "print('ok')\n")
            r = cluster.exec_py(k, code)
            assert r.returncode == 0 and r.stdout.strip() == "ok", (k, r.stderr)
        # Hosts do not see the root's other addresses: the only route out is their /24.
        r = cluster.exec_py(1, "import socket\n"
                               "try:\n"
                               "    socket.create_connection(('127.0.0.1', %d), timeout=1)\n"
                               "    print('reached')\n"
                               "except OSError:\n"
                               "    print('isolated')\n" % port)
        assert r.stdout.strip() == "isolated"
    finally:
        lsock.close()


def test_link_cut_and_restore(cluster):
    h2 = cluster.hosts[1]
    assert can_connect(h2, 22)
    # Cable cut on the bridge side: host 2 keeps its address but nothing gets through.
    assert tc("link", 2, "down").returncode == 0
    try:
        assert not can_connect(h2, 22, timeout=1)
        r = cluster.exec_py(1, f"import socket\ntry:\n socket.create_connection(('{h2}', 22), 1)\n"
                               " print('reached')\nexcept OSError:\n print('cut')\n")
        assert r.stdout.strip() == "cut"
        assert "cable DOWN" in tc("status").stdout
    finally:
        assert tc("link", 2, "up").returncode == 0
    assert wait_for(lambda: can_connect(h2, 22), 5), "host 2 unreachable after restoring its link"
    # The other way: the host's own interface down (ip link set ... down inside the host).
    h3 = cluster.hosts[2]
    assert tc("exec", 3, "ip", "link", "set", "eth0", "down").returncode == 0
    try:
        assert not can_connect(h3, 22, timeout=1)
    finally:
        assert tc("exec", 3, "ip", "link", "set", "eth0", "up").returncode == 0
    assert wait_for(lambda: can_connect(h3, 22), 5), "host 3 unreachable after eth0 up"
    assert cluster.ssh(h3, "true").returncode == 0


def test_status(cluster):
    r = tc("status")
    assert r.returncode == 0, r.stdout
    for k in range(1, N + 1):
        assert f"host {k} er-h{k} {addr(k)} sshd pid" in r.stdout


def test_not_root_skips_with_77(cluster):
    with tempfile.TemporaryDirectory() as t:
        script = Path(t) / "testcluster"
        shutil.copy(TESTCLUSTER, script)
        os.chmod(t, 0o755)
        os.chmod(script, 0o755)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            str(script), "up", "1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 77, r.stderr
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "needs root" in r.stderr


def leftovers(directory):
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [l.split()[0] for l in netns.splitlines() if l.strip()]
    ns_left = [n for n in names if n == "er-net" or (n.startswith("er-h") and n[4:].isdigit())]
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    links_left = [l.split()[0] for l in links.splitlines() if l.split()[0].startswith("er-")]
    procs = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if str(directory).encode() in (p / "cmdline").read_bytes():
                procs.append(int(p.name))
        except OSError:
            pass
    return ns_left, links_left, procs


def test_up_again_then_down_leaves_nothing(cluster):
    # Last in this file: `up` over a running cluster rebuilds it (here smaller), `down` cleans.
    r = tc("up", 2, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"CLUSTER_DIR={cluster.dir}"
    st = tc("status").stdout
    assert "host 2 " in st and "host 3 " not in st
    assert cluster.ssh(cluster.hosts[1], "true").returncode == 0
    r = tc("down")
    assert r.returncode == 0, r.stderr
    ns_left, links_left, procs = leftovers(cluster.dir)
    assert (ns_left, links_left, procs) == ([], [], [])
    assert not cluster.dir.exists()
    assert tc("status").returncode == 3
    # (No connect to the old addresses here: once the cluster is gone they are not ours, and
    # the root namespace's default route would send the packets off this machine.)
