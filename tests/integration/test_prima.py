"""The prima role on the sandbox. prima.cpp is only on GitHub, so this needs a local git
mirror of it: PRIMA_CPP_MIRROR=/path/to/prima.cpp(.git) make test (and PRIMA_CPP_VERSION=<commit>
when the mirror holds the pinned tree under another commit)."""

import os

import pytest

from conftest import NODES, local_fact, node, role_default, write_figures

MIRROR = os.environ.get("PRIMA_CPP_MIRROR", "")
COMMIT = os.environ.get("PRIMA_CPP_VERSION") or role_default("prima", "prima_version")

pytestmark = pytest.mark.skipif(
    not MIRROR, reason="PRIMA_CPP_MIRROR is not set: no local git mirror of prima.cpp to build from "
                       "(GitHub is out of reach here)")


@pytest.mark.parametrize("name", NODES)
def test_prima_built_at_the_pinned_commit(site_runs, name):
    host = node(name)
    fact = local_fact(host, "prima")
    assert fact["commit"] == COMMIT
    assert fact["prefix"] == "/opt/prima/" + fact["commit"]
    assert fact["flags"]["make_vars"]["USE_HIGHS"] == "1"
    cli = host.file(fact["prefix"] + "/bin/llama-cli")
    assert cli.sha256sum == fact["binaries"]["llama-cli"]
    linked = host.check_output("ldd %s" % cli.path)
    assert "libhighs.so" in linked and "libzmq.so" in linked and "not found" not in linked
    version = host.run("%s --version" % cli.path)
    said = version.stdout + version.stderr
    assert version.rc == 0 and COMMIT[:7] in said, said
    assert "gcc-9" in said, "not built with the toolchain's gcc-9: " + said


def test_prima_build_seconds_recorded(site_runs):
    seconds = {name: local_fact(node(name), "prima")["build_seconds"] for name in NODES}
    assert all(isinstance(value, float) and value > 0 for value in seconds.values()), seconds
    write_figures("prima-figures.json", seconds)
