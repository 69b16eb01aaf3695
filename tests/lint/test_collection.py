"""The repository is the collection prima.cluster: built into a tarball and installed somewhere else, it runs
from there (the preflight, by its full name), and it passes ansible-test sanity."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def run(argv, cwd, env, timeout=900):
    return subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The collection built from this checkout and installed into a collections path of its own; an environment
    that knows nothing of the checkout (no ansible.cfg, another working directory)."""
    work = tmp_path_factory.mktemp("installed")
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(work / "collections"), ANSIBLE_NOCOLOR="1",
               PATH=BIN + os.pathsep + env.get("PATH", ""))
    built = run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", REPO, "--output-path", str(work)], work, env)
    assert built.returncode == 0, built.stdout
    tarball = re.search(r"Created collection for prima\.cluster at (\S+)", built.stdout).group(1)
    done = run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", tarball, "-p", str(work / "collections")],
               work, env)
    assert done.returncode == 0 and "was installed successfully" in done.stdout, done.stdout
    root = work / "collections" / "ansible_collections" / "prima" / "cluster"
    assert not (root / ".collections").exists() and not (root / "requirements.lock").exists()
    # The suite stays in the checkout: only the readiness suite and the sanity ignore files ship.
    assert sorted(path.name for path in (root / "tests").iterdir()) == ["conftest.py", "readiness", "sanity"]
    return {"work": work, "env": env, "root": root}


def inventory(path, second_ip):
    path.write_text(textwrap.dedent("""\
        all:
          children:
            cluster:
              hosts:
                a: {ansible_host: 127.0.0.2, cluster_ip: 10.1.0.1}
                b: {ansible_host: 127.0.0.3, cluster_ip: %s}
        """ % second_ip))
    return str(path)


def test_the_installed_collection_runs_its_preflight(installed):
    work, env = installed["work"], installed["env"]
    good = run([os.path.join(BIN, "ansible-playbook"), "-i", inventory(work / "good.yml", "10.1.0.2"),
                "prima.cluster.preflight"], work, env)
    assert good.returncode == 0, good.stdout
    assert "prima.cluster.cluster : Validating arguments" in good.stdout
    assert re.search(r'"a": 0,\s+"b": 1', good.stdout), good.stdout
    bad = run([os.path.join(BIN, "ansible-playbook"), "-i", inventory(work / "bad.yml", "10.1.0.1"),
               "prima.cluster.preflight"], work, env)
    assert bad.returncode != 0 and "hosts a, b: they share cluster_ip 10.1.0.1" in bad.stdout, bad.stdout


def pip_bootstrap_cache():
    """Where ansible-test looks for pip's bootstrap script before it downloads one."""
    import ansible_test

    source = os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")
    with open(source) as handle:
        version = re.search(r"pip='([\d.]+)'", handle.read()).group(1)
    return os.path.expanduser("~/.ansible/test/cache/get_pip_%s.py" % version.replace(".", "_"))


def test_ansible_test_sanity(installed):
    """Every sanity test of this ansible-core, on the installed tree; tests/sanity/ignore-*.txt says what is
    excepted, and why. Each test's requirements go into a virtual environment of ansible-test's own."""
    cache = pip_bootstrap_cache()
    if not os.path.exists(cache):
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        shutil.copy(os.path.join(REPO, "tests", "lint", "get_pip.py"), cache)
    result = run([os.path.join(BIN, "ansible-test"), "sanity", "--color", "no",
                  "--python", "%d.%d" % sys.version_info[:2]], installed["root"], installed["env"], timeout=1200)
    errors = [line for line in result.stdout.splitlines() if line.startswith(("ERROR", "FATAL"))]
    assert result.returncode == 0, "\n".join(errors) or result.stdout[-4000:]
