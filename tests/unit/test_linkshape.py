"""Link shaping for the sweeps: rates, tbf parameters, tc argv, and tc's refusals told plainly."""

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.link.shaping import (
    interface_with, parse_delay, route_source, parse_links, parse_rate, shaping_commands, shaping_result, step_commands,
    tbf_burst_bytes, tc_notice, tc_rate)


def test_rates():
    assert parse_rate("1gbit") == 10 ** 9 and parse_rate("2.5gbit") == 2_500_000_000
    assert parse_rate("100mbit") == 10 ** 8
    with pytest.raises(ValueError, match="write it like 1gbit"):
        parse_rate("fast")
    assert tc_rate(2_500_000_000) == "2500mbit" and tc_rate(10 ** 9) == "1gbit" and tc_rate(1500) == "1500bit"


def test_sweep_steps():
    assert parse_links(None) == parse_links("") == [{"label": "unshaped", "bits": 0, "delay_ms": 0.0}]
    assert parse_links("1gbit, 2.5Gbit:2ms") == [{"label": "1gbit", "bits": 10 ** 9, "delay_ms": 0.0},
                                                 {"label": "2.5gbit:2ms", "bits": 2_500_000_000, "delay_ms": 2.0}]
    assert parse_links(["10gbit"])[0]["bits"] == 10 ** 10
    assert parse_delay("500us") == 0.5
    with pytest.raises(ValueError) as error:
        parse_links("1gbit,fast,1gbit,10kbit,1gbit:soon")
    message = str(error.value)
    for part in ("links: link rate 'fast'", "links: 1gbit is given twice", "10kbit is below 100kbit",
                 "added delay 'soon'", "-e links=1gbit,2.5gbit,10gbit"):
        assert part in message


def test_interface_holding_the_cluster_address():
    output = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
              "2: eth0@if7    inet 10.77.0.10/24 brd 10.77.0.255 scope global eth0\\       valid_lft forever\n")
    assert interface_with("10.77.0.10", output) == "eth0"
    assert interface_with("10.77.0.1", output) is None


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


def test_notices():
    assert "no netem qdisc" in tc_notice("Error: Specified qdisc kind is unknown.\n")
    assert "NET_ADMIN" in tc_notice("RTNETLINK answers: Operation not permitted\n")
    assert tc_notice("something else") is None


def ok(argv=None):
    return {"rc": 0, "stderr": "", "cmd": argv or ["tc"]}


def refused(stderr):
    return {"rc": 2, "stderr": stderr, "cmd": ["tc"]}


def test_what_a_step_achieved():
    rate = {"label": "1gbit", "bits": 10 ** 9, "delay_ms": 0.0}
    delayed = {"label": "1gbit:2ms", "bits": 10 ** 9, "delay_ms": 2.0}
    assert shaping_result([ok()], [], rate) == {"label": "1gbit", "shaped": True, "delay_applied": False,
                                                "notice": "", "error": ""}
    assert shaping_result([ok(), ok()], [], delayed)["delay_applied"] is True
    # No netem in this kernel: the rate alone, and a notice that says so.
    no_netem = shaping_result([refused("Error: Specified qdisc kind is unknown."), refused("x")], [ok()], delayed)
    assert no_netem["shaped"] and not no_netem["delay_applied"] and "no netem qdisc" in no_netem["notice"]
    # A container without NET_ADMIN: not shaped, a notice; anything else is an error.
    forbidden = shaping_result([refused("RTNETLINK answers: Operation not permitted")], [], rate)
    assert not forbidden["shaped"] and "NET_ADMIN" in forbidden["notice"] and forbidden["error"] == ""
    broken = shaping_result([refused("Error: Invalid burst")], [], rate)
    assert not broken["shaped"] and broken["error"] == "Error: Invalid burst"


def test_step_commands():
    assert step_commands("eth0", {"bits": 10 ** 8, "delay_ms": 2.0}, True)[0][6:10] == ["handle", "1:", "netem", "delay"]
    assert step_commands("eth0", {"bits": 10 ** 8, "delay_ms": 2.0}, False)[0][6:9] == ["tbf", "rate", "100mbit"]


def test_route_source_is_the_address_after_src():
    assert route_source("192.0.2.1 via 10.77.0.1 dev eth0 src 10.77.0.10 uid 0 \\    cache ") == "10.77.0.10"
    assert route_source("unreachable") == "" and route_source("x src") == ""
