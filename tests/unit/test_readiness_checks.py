"""Pure pieces of the readiness suite."""

from ansible_collections.prima.cluster.plugins.module_utils.ring_probe import listening_ports
from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.readiness import (
    compiler_command, expected_weights, first_line, glance, version_at_least)

PROC_NET_TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0A4D000A:C364 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0A4D000A:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0A4D000A:0016 0A4D0001:D2F0 01 00000000:00000000 02:00000000 00000000     0        0 3 2 0 20 4 30 10 -1
"""


def test_listening_ports_only_in_state_listen():
    # 0xC364 = 50020, 0x0016 = 22; the third line is an established connection on 22
    assert listening_ports(PROC_NET_TCP) == {50020, 22}


def test_versions():
    assert version_at_least("4.3.4", "4.3.2") and not version_at_least("4.3.1", "4.3.2")
    assert not version_at_least("", "4.3.2") and version_at_least("10.0", "4.3.2")


def test_compiler_command_skips_ccache():
    assert compiler_command("ccache g++-9 9.3.0-22") == "g++-9"
    assert compiler_command("g++ 12.2.0") == "g++" and compiler_command("") == ""


def test_expected_weights():
    files = [{"name": "a.gguf", "size": 10, "sha256": "ab"}, {"name": "b.gguf", "size": None, "sha256": ""}]
    assert expected_weights(files, "/opt/models/") == [
        {"name": "a.gguf", "path": "/opt/models/a.gguf", "size": 10, "sha256": "ab"},
        {"name": "b.gguf", "path": "/opt/models/b.gguf", "size": 0, "sha256": ""}]


def test_glance_table_and_reasons():
    text = glance({("weights", "n0"): ("pass", ""), ("weights", "n1"): ("FAIL", "tiny.gguf is missing"),
                   ("fio", "n0"): ("pass", ""), ("fio", "n1"): ("pass", "")}, ["n0", "n1"])
    lines = text.splitlines()
    assert lines[0].split() == ["check", "n0", "n1"]
    assert lines[1].split() == ["weights", "pass", "FAIL"] and lines[2].split() == ["fio", "pass", "pass"]
    assert lines[-1] == "weights on n1: tiny.gguf is missing"


def test_first_line_of_an_assertion():
    assert first_line("AssertionError: tiny.gguf is missing: run site.yml\nassert False") == \
        "AssertionError: tiny.gguf is missing: run site.yml"
    assert first_line(None) == ""


def test_first_line_of_an_unreachable_node():
    message = ("RuntimeError: CommandResult(backend=<x>, exit_status=255, command=b'ls', _stdout=b'', "
               "_stderr=b'ssh: connect to host 10.77.0.11 port 22: Connection refused\\r\\n')")
    assert first_line(message) == "node unreachable: ssh: connect to host 10.77.0.11 port 22: Connection refused"
