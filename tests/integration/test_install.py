"""`meson install` gives a working installation: into a scratch root (--destdir), then the
installed pieces are used as a user would: libelasticrun.so with its SONAME, a C and a C++
program compiled against it through pkg-config and run as a job by the installed
elasticrun (which finds the installed elasticrund beside it), the installed Python package,
the discovery scripts, the systemd unit, and bash completion for elasticrun, elasticrun
sweep and elasticrund. With ELASTICRUN_TEST_PACKAGES=1 the Debian packages of
scripts/package are built and installed into a scratch root too (a full build: minutes)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, ROOT, job  # noqa: F401 (job: a fixture)
from test_sgd import finals

SGD_ARGS = ["--steps", "60", "--dim", "32", "--batch", "24"]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The scratch root and the prefix under it, as `meson install --destdir` made them."""
    root = tmp_path_factory.mktemp("root")
    run(["meson", "install", "-C", str(BUILD), "--no-rebuild", "--quiet", "--destdir", str(root)])
    prefix = run(["meson", "introspect", "--buildoptions", str(BUILD)]).stdout
    import json
    opts = {o["name"]: o["value"] for o in json.loads(prefix)}
    return root, root / opts["prefix"].lstrip("/"), opts


def libdir(installed):
    root, prefix, opts = installed
    return prefix / opts["libdir"]


def env_for(installed, **extra):
    """An environment that sees the installed tree only: its bin on PATH (no build/), its
    libraries on LD_LIBRARY_PATH, its pkg-config file."""
    root, prefix, opts = installed
    path = [str(prefix / "bin"), str(prefix / "sbin")] + [p for p in os.environ["PATH"].split(":")
                                                        if p and str(BUILD) not in p]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(PATH=":".join(path), LD_LIBRARY_PATH=str(libdir(installed)),
               PKG_CONFIG_PATH=str(libdir(installed) / "pkgconfig"), PKG_CONFIG_SYSROOT_DIR=str(root))
    env.update(extra)
    return env


def test_layout_and_soname(installed):
    root, prefix, opts = installed
    lib = libdir(installed)
    for rel in ["bin/elasticrun", "sbin/elasticrund", "include/elasticrun/elasticrun.h",
                "include/elasticrun/elasticrun.hpp", "share/elasticrun/discovery/slurm",
                "share/elasticrun/discovery/kubernetes", "share/bash-completion/completions/elasticrun",
                "share/man/man1/elasticrun.1", "share/man/man3/libelasticrun.3", "share/man/man8/elasticrund.8",
                "libexec/elasticrun/examples/elastic_sgd", "lib/systemd/system/elasticrund.service"]:
        # a package's manual pages are compressed (dh_compress)
        assert (prefix / rel).exists() or (rel.startswith("share/man/") and (prefix / (rel + ".gz")).exists()), rel
    assert os.access(prefix / "share/elasticrun/discovery/slurm", os.X_OK)
    assert os.readlink(prefix / "share/bash-completion/completions/elasticrund") == "elasticrun"
    assert not (prefix / "bin" / "elastic_sgd").exists(), "examples belong under libexec, not in bin"
    real = sorted(p.name for p in lib.glob("libelasticrun.so*"))
    assert real[:2] == ["libelasticrun.so", "libelasticrun.so.0"] and len(real) == 3, real
    dyn = run(["readelf", "-d", str(lib / "libelasticrun.so")]).stdout
    assert re.search(r"\(SONAME\)\s+Library soname: \[libelasticrun\.so\.0\]", dyn), dyn
    unit = (prefix / "lib/systemd/system/elasticrund.service").read_text()
    assert f"ExecStart={opts['prefix']}/{opts['sbindir']}/elasticrund" in unit, unit


def test_programs_built_through_pkg_config_run_as_a_job(installed, job, tmp_path):
    """examples/elastic_sgd_c.c (the C API) and examples/elastic_sgd.cc (C++), compiled with
    `pkg-config --cflags --libs elasticrun` against the scratch root, run under the installed
    elasticrun at 2 ranks; both train to the same model."""
    env = env_for(installed)
    flags = run(["pkg-config", "--cflags", "--libs", "elasticrun"], env=env).stdout.split()
    assert any(f.startswith("-I" + str(installed[0])) for f in flags), flags
    c_prog, cc_prog = tmp_path / "sgd_c", tmp_path / "sgd_cc"
    run(["cc", "-std=c11", "-O1", "-o", str(c_prog), str(ROOT / "examples/elastic_sgd_c.c"), *flags, "-lm"], env=env)
    run(["c++", "-std=c++20", "-O1", "-o", str(cc_prog), str(ROOT / "examples/elastic_sgd.cc"), *flags], env=env)
    outs = []
    for prog in (c_prog, cc_prog):
        r = subprocess.run(["elasticrun", "-np", "2", str(prog), *SGD_ARGS], capture_output=True, text=True,
                           timeout=120, env=job.env(env))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        outs.append(finals(r.stdout))
    assert len(outs[0]) == 2 and outs[0] == outs[1], outs


def test_the_installed_python_package_runs_a_job(installed, job, tmp_path):
    root, prefix, opts = installed
    site = [p for p in prefix.glob("lib/python3*/dist-packages") if (p / "elasticrun").is_dir()]
    assert site, "no installed elasticrun package"
    script = tmp_path / "t.py"
    script.write_text("import numpy, elasticrun as er\ner.init()\nx = numpy.full(4, er.rank() + 1.0)\n"
                      "er.allreduce(x, out=x)\nprint('sum', x[0], er.__file__)\n")
    env = env_for(installed, PYTHONPATH=str(site[0]))
    r = subprocess.run(["elasticrun", "-np", "2", "-x", "PYTHONPATH", "/usr/bin/python3", str(script)],
                       capture_output=True, text=True, timeout=120, env=job.env(env))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    lines = re.findall(r"sum (\S+) (\S+)", r.stdout)
    assert len(lines) == 2 and all(v == "3.0" and f.startswith(str(site[0])) for v, f in lines), r.stdout


COMPLETE = """
. /usr/share/bash-completion/bash_completion
. "$COMPLETION"
comp() {
  COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
  COMPREPLY=(); _elasticrun "${COMP_WORDS[0]}" "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}" 2>/dev/null
  echo "$*|${COMPREPLY[*]}"
}
comp elasticrun --lau
comp elasticrun --launcher ''
comp elasticrun -np 2 -H a:2 ech
comp elasticrun sweep --trial-
comp elasticrun sw
comp elasticrund --lis
"""


def test_bash_completion(installed):
    """The installed completion, with the installed binaries on PATH: options from each
    program's --help (elasticrun, elasticrun sweep, elasticrund), the launcher's values,
    and the command to run completed as a command once the options end."""
    if not Path("/usr/share/bash-completion/bash_completion").exists():
        pytest.skip("bash-completion is not installed (scripts/setup installs it)")
    root, prefix, opts = installed
    env = env_for(installed, COMPLETION=str(prefix / "share/bash-completion/completions/elasticrun"))
    out = run(["bash", "-c", COMPLETE], env=env).stdout
    got = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
    assert got["elasticrun --lau"].split() == ["--launcher"], got
    assert got["elasticrun --launcher "].split() == ["auto", "ssh", "srun"], got
    assert "echo" in got["elasticrun -np 2 -H a:2 ech"].split(), got
    assert {"--trial-np", "--trial-arg"} <= set(got["elasticrun sweep --trial-"].split()), got
    assert "sweep" in got["elasticrun sw"].split(), got
    assert got["elasticrund --lis"].split() == ["--listen"], got


@pytest.mark.skipif(os.environ.get("ELASTICRUN_TEST_PACKAGES") != "1",
                    reason="builds the Debian packages (minutes): ELASTICRUN_TEST_PACKAGES=1")
def test_debian_packages_install_into_a_scratch_root_and_run_a_job(job, tmp_path):
    r = subprocess.run([str(ROOT / "scripts" / "package")], capture_output=True, text=True, timeout=3000)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    debs = sorted(d for d in (BUILD / "packages").glob("*.deb") if "-dbgsym_" not in d.name)
    names = sorted(d.name.split("_")[0] for d in debs)
    assert names == ["elasticrun", "libelasticrun-dev", "libelasticrun0", "python3-elasticrun"], names
    root = tmp_path / "root"
    for d in debs:
        run(["dpkg-deb", "-x", str(d), str(root)])
    shlibs = run(["dpkg-deb", "-f", str([d for d in debs if d.name.startswith("elasticrun_")][0]), "Depends"]).stdout
    assert "libelasticrun0" in shlibs, shlibs
    multiarch = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
    installed = (root, root / "usr", {"prefix": "/usr", "libdir": f"lib/{multiarch}", "sbindir": "sbin"})
    test_layout_and_soname(installed)
    test_programs_built_through_pkg_config_run_as_a_job(installed, job, tmp_path)
    test_the_installed_python_package_runs_a_job(installed, job, tmp_path)
