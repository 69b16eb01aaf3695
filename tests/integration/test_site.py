"""site.yml on the sandbox, for real: a cold run, an idempotent second run, --check,
working binaries on every node, a rebuild exactly when the build inputs change, and the cluster lock (refused while
a live run holds it; one older than its bound broken by the session's second run)."""

import os
import re

import pytest

from conftest import (LOCK, LOCK_ON_NODE, NODE_ROOT, NODES, PRIMA, STALE_LOCK_RUN_ID, local_fact, node, planted_lock, role_default,
                      run_playbook, sandbox_var, write_figures)
from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.readiness import version_tuple

FORWARDERS_SCRIPT = "/etc/prima-bench/transport/forwarders.sh"


def test_second_run_changes_nothing(site_runs):
    cold, second = site_runs
    assert second.status == "successful", second.describe()
    assert sorted(second.count("ok")) == sorted(NODES + ["localhost"])
    assert {host: n for host, n in second.count("changed").items() if n} == {}, second.describe()
    figures = {
        "cold_seconds": round(cold.seconds, 1),
        "second_seconds": round(second.seconds, 1),
        "second_to_cold_ratio": round(second.seconds / cold.seconds, 3),
        "build_seconds": {},
    }
    for name in NODES:
        host = node(name)
        figures["build_seconds"][name] = {
            "highs": local_fact(host, "highs")["build_seconds"],
            "llama_cpp": local_fact(host, "llama_cpp")["build_seconds"],
        }
    write_figures("site-figures.json", figures)


def test_site_says_when_and_why_it_leaves_prima_out(site_runs):
    cold, second = site_runs
    notice = "NOTICE: prima.cpp is not built on n0, n1, n2: prima_enabled is false (the sandbox builds it from a " \
             "local mirror only: set PRIMA_CPP_MIRROR"
    assert any(line.startswith(notice) for line in cold.messages) != PRIMA, cold.describe()
    # The second run is the README's command through bash: its output, as printed.
    assert (notice in " ".join(second.stdout.split())) != PRIMA, second.describe()


def test_check_mode_is_clean_where_nothing_drifted_and_finds_a_transport_file_edited_since(site_runs):
    # site.yml sets the transport up again where what the last setup left on a node differs from its record; the
    # same nodes with nothing changed set nothing up again (test_second_run_changes_nothing).
    script = os.path.join(NODE_ROOT % NODES[1], FORWARDERS_SCRIPT.lstrip("/"))
    with open(script, "rb") as handle:
        original = handle.read()
    with open(script, "ab") as handle:
        handle.write(b"# edited by hand\n")
    try:
        check = run_playbook("site.yml", cmdline="--check", label="site-check")
        with open(script, "rb") as handle:
            assert handle.read() == original + b"# edited by hand\n", "--check wrote the file"
    finally:
        with open(script, "wb") as handle:
            handle.write(original)
    assert check.status == "successful", check.describe()
    changed = {host: n for host, n in check.count("changed").items() if n}
    assert list(changed) == [NODES[1]], check.describe()
    included = re.search(r"transport/tasks/write\.yml for ([\w, ]+)", check.stdout)
    assert included and included.group(1).strip() == NODES[1], check.stdout[-4000:]


@pytest.mark.parametrize("name", NODES)
def test_llama_cpp_binaries_run(site_runs, name):
    host = node(name)
    fact = local_fact(host, "llama_cpp")
    version = host.run("/opt/llama.cpp/current/bin/llama-completion --version")
    assert version.rc == 0, version.stderr
    build = role_default("llama_cpp", "llama_cpp_sdist_build_number")
    commit = role_default("llama_cpp", "llama_cpp_sdist_commit")
    assert "build %s, commit %s" % (build, commit) in version.stdout + version.stderr
    assert "GNU 9." in version.stdout + version.stderr, "not built with gcc-9"
    for binary in ["ggml-rpc-server", "llama-bench", "llama-cli", "llama-server"]:
        result = host.run("/opt/llama.cpp/current/bin/%s --help" % binary)
        assert result.rc == 0, (binary, result.stdout, result.stderr)
    assert sorted(fact["binaries"]) == sorted(role_default("llama_cpp", "llama_cpp_targets"))
    for binary, digest in fact["binaries"].items():
        assert host.file("%s/bin/%s" % (fact["prefix"], binary)).sha256sum == digest
    assert fact["commit"] == commit
    assert host.file("/opt/llama.cpp/current").linked_to == fact["prefix"]


@pytest.mark.parametrize("name", NODES)
def test_highs_and_zeromq_are_usable(site_runs, name):
    host = node(name)
    loader = host.run("/sbin/ldconfig -p")
    assert "libhighs.so" in loader.stdout
    # The loader finds libhighs by name, and the library answers with the pinned version.
    version = host.check_output(
        "python3 -c \"import ctypes; lib = ctypes.CDLL('libhighs.so'); "
        "lib.Highs_version.restype = ctypes.c_char_p; print(lib.Highs_version().decode())\"")
    assert version == role_default("highs", "highs_version")
    assert host.file("/usr/local/include/highs/Highs.h").exists
    libzmq = host.check_output("pkg-config --modversion libzmq")
    assert version_tuple(libzmq) >= version_tuple(role_default("zeromq", "zeromq_min_version")), libzmq
    assert host.exists("fio") and host.exists("gcc-9") and host.exists("ccache")
    highs = local_fact(host, "highs")
    assert highs["version"] == role_default("highs", "highs_version")
    assert highs["binaries"]["libhighs.so"] == host.file("/usr/local/lib/libhighs.so").sha256sum


BUILDS = ["highs", "llama_cpp"] + (["prima"] if PRIMA else [])
# A flag of each build that changes its build inputs but not what the compiler is asked: the rebuild is real
# (configure, compile, install, hash), and the shared ccache serves it.
CHANGED_FLAG = {
    "highs": {"highs_cmake_extra_args": sandbox_var("highs_cmake_extra_args") + ["-DCMAKE_VERBOSE_MAKEFILE=OFF"]},
    "llama_cpp": {"llama_cpp_extra_cmake_args": sandbox_var("llama_cpp_extra_cmake_args")
                  + ["-DCMAKE_VERBOSE_MAKEFILE=OFF"]},
    "prima": {"prima_extra_make_vars": {"PRIMA_CLUSTER_TEST_FLAG": "1"}},
}


# One representative per kind of build (every build goes through role pinned_build): llama.cpp for the CMake
# builds (HiGHS is built the same way), prima.cpp for make. A rebuild and its restore take 90 s each.
@pytest.mark.parametrize("changed", ["llama_cpp", pytest.param(
    "prima", marks=pytest.mark.skipif(not PRIMA, reason="prima.cpp is built only with PRIMA_CPP_MIRROR"))])
def test_a_changed_flag_rebuilds_that_build_only(site_runs, changed):
    host = node("n0")
    before = {build: local_fact(host, build) for build in BUILDS}
    run = run_playbook("playbooks/provision.yml", limit="n0", extravars=CHANGED_FLAG[changed],
                       label="provision-changed-%s" % changed)
    assert run.status == "successful", run.describe()
    after = {build: local_fact(host, build) for build in BUILDS}
    assert after[changed]["build_key"] != before[changed]["build_key"]
    assert after[changed]["flags"] != before[changed]["flags"] and after[changed]["build_seconds"] > 0
    for build in BUILDS:
        if build != changed:
            assert after[build] == before[build], "%s was rebuilt when only %s's flags changed" % (build, changed)

    restored = run_playbook("playbooks/provision.yml", limit="n0", label="provision-restored-%s" % changed)
    assert restored.status == "successful", restored.describe()
    back = {build: local_fact(host, build) for build in BUILDS}
    assert back[changed]["build_key"] == before[changed]["build_key"]
    assert {build: back[build] for build in BUILDS if build != changed} == \
        {build: before[build] for build in BUILDS if build != changed}


def test_site_is_refused_while_another_run_holds_the_cluster_and_breaks_a_lock_older_than_its_bound(site_runs):
    with planted_lock("running-2", bound_s=600) as record:
        refused = run_playbook("site.yml", label="lock-site-refused")
        assert refused.status == "failed", refused.describe()
        assert "another bench.yml is running on this cluster: n0 holds %s for run running-2 (" % LOCK_ON_NODE \
            in " ".join(refused.stdout.split()), refused.describe()
        assert "PLAY [Provision the nodes]" not in refused.stdout, "site.yml went on past the lock"
        assert os.readlink(LOCK) == record

    # Its bound passed: hung or gone, its lock is broken even though its process still runs. The session's
    # second site.yml found such a lock (site_runs planted it, 2 h old, bound 600 s, its holder running).
    again = site_runs[1]
    assert again.status == "successful", again.describe()
    text = " ".join(again.stdout.split())
    assert "NOTICE: n0: broke the cluster lock %s held by run %s (" % (LOCK_ON_NODE, STALE_LOCK_RUN_ID) in text, \
        again.describe()
    assert "older than the 600 s bound of its run" in text
    assert {host: n for host, n in again.count("changed").items() if n} == {}, again.describe()
    assert not os.path.lexists(LOCK), "site.yml did not release the lock"
