"""Link shaping for the sweeps: rates, tbf parameters, tc argv, and tc's refusals told plainly."""

import os
import shutil
import subprocess

import pytest

from linkshape import parse_rate, removal_command, shaping_commands, tbf_burst_bytes, tc_notice, tc_rate


def test_rates():
    assert parse_rate("1gbit") == 10 ** 9 and parse_rate("2.5gbit") == 2_500_000_000
    assert parse_rate("100mbit") == 10 ** 8
    with pytest.raises(ValueError, match="write it like 1gbit"):
        parse_rate("fast")
    assert tc_rate(2_500_000_000) == "2500mbit" and tc_rate(10 ** 9) == "1gbit" and tc_rate(1500) == "1500bit"


def test_tbf_burst_covers_a_timer_tick():
    # 10 Gbit/s at HZ 250: 10e9 / 8 / 250 = 5,000,000 bytes a tick
    assert tbf_burst_bytes(10 ** 10) == 5_000_000
    # 100 Mbit/s: 50,000 bytes a tick, above ten 1514-byte frames (15,140)
    assert tbf_burst_bytes(10 ** 8) == 50_000 and tbf_burst_bytes(10 ** 6) == 15_140


def test_commands():
    assert shaping_commands("eth0", 10 ** 9) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "1gbit", "burst", "500000", "latency", "50ms"]]
    delayed = shaping_commands("eth0", 10 ** 9, delay_ms=0.5, netem=True)
    assert delayed[0][-4:] == ["1:", "netem", "delay", "0.5ms"] and delayed[1][5:9] == ["parent", "1:1", "handle", "10:"]
    assert shaping_commands("eth0", 10 ** 9, delay_ms=0.5, netem=False)[0][6] == "tbf"
    assert removal_command("eth0") == ["tc", "qdisc", "del", "dev", "eth0", "root"]


def test_notices():
    assert "no netem qdisc" in tc_notice("Error: Specified qdisc kind is unknown.\n")
    assert "NET_ADMIN" in tc_notice("RTNETLINK answers: Operation not permitted\n")
    assert tc_notice("something else") is None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and tc (iproute2)")
def test_this_kernel_in_a_namespace_of_our_own():
    """tbf shapes; netem either works or is reported as missing, never silently ignored."""
    namespace = "psb-test-linkshape"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        def tc(argv):
            return subprocess.run(["ip", "netns", "exec", namespace] + argv, capture_output=True, text=True)

        tc(["ip", "link", "set", "lo", "up"])
        shaped = tc(shaping_commands("lo", 10 ** 9)[0])
        assert shaped.returncode == 0, shaped.stderr
        assert "tbf" in tc(["tc", "qdisc", "show", "dev", "lo"]).stdout
        netem = tc(shaping_commands("lo", 10 ** 9, delay_ms=1, netem=True)[0])
        assert netem.returncode == 0 or "no netem qdisc" in tc_notice(netem.stderr)
        assert tc(removal_command("lo")).returncode == 0
        assert "tbf" not in tc(["tc", "qdisc", "show", "dev", "lo"]).stdout
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=True)
