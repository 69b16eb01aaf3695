"""site.yml on the sandbox, for real: a cold run, an idempotent second run, --check,
working binaries on every node, and a rebuild exactly when the build inputs change."""

import pytest

from conftest import NODES, local_fact, node, run_playbook, write_figures


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


def test_check_mode_is_clean(site_runs):
    check = run_playbook("site.yml", cmdline="--check", label="site-check")
    assert check.status == "successful", check.describe()
    assert {host: n for host, n in check.count("changed").items() if n} == {}, check.describe()


@pytest.mark.parametrize("name", NODES)
def test_llama_cpp_binaries_run(site_runs, name):
    host = node(name)
    fact = local_fact(host, "llama_cpp")
    version = host.run("/opt/llama.cpp/current/bin/llama-completion --version")
    assert version.rc == 0, version.stderr
    assert "build 11312, commit 0c1e570" in version.stdout + version.stderr
    assert "GNU 9." in version.stdout + version.stderr, "not built with gcc-9"
    for binary in ["ggml-rpc-server", "llama-bench", "llama-cli", "llama-server"]:
        result = host.run("/opt/llama.cpp/current/bin/%s --help" % binary)
        assert result.rc == 0, (binary, result.stdout, result.stderr)
    for binary, digest in fact["binaries_sha256"].items():
        assert host.file("%s/bin/%s" % (fact["prefix"], binary)).sha256sum == digest
    assert fact["commit"] == "0c1e570"
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
    assert version == "1.15.1"
    assert host.file("/usr/local/include/highs/Highs.h").exists
    assert host.check_output("pkg-config --modversion libzmq").split(".") >= ["4", "3", "2"]
    assert host.exists("fio") and host.exists("gcc-9") and host.exists("ccache")
    assert local_fact(host, "highs")["version"] == "1.15.1"


def test_rebuild_exactly_when_build_inputs_change(site_runs):
    host = node("n0")
    before = local_fact(host, "llama_cpp")
    fewer_targets = ["ggml-rpc-server", "llama-completion", "llama-bench", "llama-cli"]
    changed = run_playbook("site.yml", limit="localhost,n0", extravars={"llama_cpp_targets": fewer_targets},
                           label="site-rebuild-changed-targets")
    assert changed.status == "successful", changed.describe()
    assert changed.count("changed").get("n0", 0) > 0
    after = local_fact(host, "llama_cpp")
    assert after["build_key"] != before["build_key"]
    assert sorted(after["binaries_sha256"]) == sorted(fewer_targets)

    restored = run_playbook("site.yml", limit="localhost,n0", label="site-rebuild-restored")
    assert restored.status == "successful", restored.describe()
    assert local_fact(host, "llama_cpp")["build_key"] == before["build_key"]
    again = run_playbook("site.yml", limit="localhost,n0", label="site-rebuild-again")
    assert again.count("changed").get("n0", 0) == 0, again.describe()
