"""scripts/discovery/kubernetes: no Kubernetes API server can run here, so its parsing is
checked on a PodList in kubectl's `get pods -o json` format (data/k8s_pods.json, written
from the core/v1 schema: running and ready pods, one not ready, one pending without an
IP, one terminating, one finished, an IPv6 pod, per-pod slots by annotation, a bad
annotation), and its failures against the real kubectl with no cluster to reach."""
import os
import subprocess

import pytest

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "discovery" / "kubernetes"
PODS = ROOT / "tests" / "integration" / "data" / "k8s_pods.json"


def discover(*args, env=None, **kw):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})}, **kw)


def test_lists_running_ready_pods_with_their_slots():
    r = discover("--json", str(PODS))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["10.244.1.5:1", "10.244.2.7:4", "[fd00:10:244::12]:1"]
    assert "elasticrun-worker-7: annotation elasticrun.io/slots 'lots' is not a count" in r.stderr


def test_names_and_default_slots():
    r = discover("--json", "-", "--names", "--slots", "2", input=PODS.read_text())
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["elasticrun-worker-0:2", "elasticrun-worker-1:4", "elasticrun-worker-6:2"]
    r = discover("--json", str(PODS), env={"ER_K8S_SLOTS": "3"})
    assert r.stdout.splitlines()[0] == "10.244.1.5:3", r.stdout


@pytest.mark.parametrize("text", ["", "not json", "{}", '{"items": 3}', "[]"])
def test_output_that_is_no_pod_list_fails(text):
    r = discover("--json", "-", input=text)
    assert r.returncode == 1
    assert "not a Kubernetes pod list" in r.stderr


@pytest.mark.parametrize("args,why", [
    ([], "no label selector"),
    (["-l", "app=x", "--slots", "0"], "--slots needs a count"),
    (["-l", "app=x", "--slots", "x"], "--slots needs a count"),
    (["--bogus"], "unknown argument '--bogus'"),
])
def test_bad_arguments(args, why):
    r = discover(*args, env={"ER_K8S_SELECTOR": ""})
    assert r.returncode == 2, r.stderr
    assert why in r.stderr


def test_kubectl_that_reaches_no_cluster_fails_with_its_command(tmp_path):
    """The real kubectl, with a kubeconfig naming a server on a loopback port nothing
    listens on: the script exits 1 and names the command."""
    config = tmp_path / "kubeconfig"
    config.write_text("""apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
users: [{name: none, user: {token: x}}]
""")
    r = discover("-l", "app=elasticrun-worker", "-n", "training", env={"KUBECONFIG": str(config)})
    if "No such file" in r.stderr or "command not found" in r.stderr:
        pytest.skip("no kubectl (scripts/setup installs Debian's kubernetes-client)")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kubectl get pods -o json -l app=elasticrun-worker -n training failed" in r.stderr


def test_example_manifests_use_options_the_binaries_have():
    """examples/kubernetes: valid YAML, and every --option of the driver's and the
    daemons' command lines is one that `elasticrun --help` / `elasticrund --help` lists
    (an option renamed later breaks this test, not a user's cluster)."""
    import re
    import yaml
    from conftest import ELASTICRUN, ELASTICRUND
    docs = [d for f in ("workers.yaml", "driver.yaml")
            for d in yaml.safe_load_all((ROOT / "examples" / "kubernetes" / f).read_text()) if d]
    assert sorted(d["kind"] for d in docs) == ["Job", "Role", "RoleBinding", "Service", "ServiceAccount",
                                               "StatefulSet"]
    commands = {d["kind"]: d["spec"]["template"]["spec"]["containers"][0]["command"] for d in docs
                if d["kind"] in ("Job", "StatefulSet")}
    for kind, binary in (("Job", ELASTICRUN), ("StatefulSet", ELASTICRUND)):
        listed = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30).stdout
        used = [a.split("=")[0] for a in commands[kind] if a.startswith("--")]
        assert used, commands[kind]
        for option in used:
            assert re.search(rf"{re.escape(option)}\b", listed), f"{kind}: {option} is not in {binary.name} --help"
