"""What a bench run cost: node prices (glows_price_cent), the run's cost, dollars per million generated tokens."""

import math

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.filter.bench_cost import prices as prices_filter
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.cost import (cost_text, duration_text, host_prices,
                                                                               hourly_usd, money, mtok_cell, node_price,
                                                                               node_prices, price_cell, price_problems,
                                                                               record_prices, report_cost, run_cost,
                                                                               usd_per_mtok, wall_time_s)


@pytest.mark.parametrize("value, expected", [(65, 65), (65.5, 65.5), ("65", 65), (" 120 ", 120), ("0.5", 0.5),
                                             (None, None), (0, None), (0.0, None), ("0", None),
                                             (10 ** 30, 10 ** 30)])
def test_a_price_is_a_positive_number_of_cents(value, expected):
    assert node_price(value) == expected and type(node_price(value)) is type(expected)


@pytest.mark.parametrize("value, why", [(-65, "not a positive number"), (-0.5, "not a positive number"),
                                        ("-1", "not a positive number"), (True, "boolean"), (False, "boolean"),
                                        ("abc", "not a number"), ("", "not a number"), ([65], "not a number"),
                                        (float("nan"), "not a finite number"), (float("inf"), "not a finite number"),
                                        ("1e400", "not a finite number"), (10 ** 400, "too large")])
def test_anything_else_is_refused_saying_why(value, why):
    with pytest.raises(ValueError, match=why):
        node_price(value)


def test_problems_name_the_host_and_the_variable():
    hostvars = {"n0": {"glows_price_cent": 65}, "n1": {"glows_price_cent": "cheap"}, "n2": {}}
    assert price_problems(["n0", "n1", "n2"], hostvars) == [
        "host n1: glows_price_cent 'cheap' is not a number: give the price in US cents per hour, a positive number "
        "(65 means $0.65/h), or leave it unset (or 0) for none"]
    assert host_prices(["n0", "n2"], hostvars) == {"n0": 65, "n2": None}
    with pytest.raises(ValueError):
        host_prices(["n1"], hostvars)


def test_the_filter_refuses_a_bad_price_naming_the_host():
    assert prices_filter(["n0"], {"n0": {"glows_price_cent": "65"}}) == {"n0": 65}
    assert prices_filter(["n0", "n1"], {"n0": {}, "n1": {"glows_price_cent": 0}}) == {"n0": None, "n1": None}
    with pytest.raises(AnsibleFilterError, match="bench_prices: host n1: glows_price_cent -1 is not a positive"):
        prices_filter(["n0", "n1"], {"n0": {}, "n1": {"glows_price_cent": -1}})


def test_hourly_price_of_nodes_together():
    # 65 + 65 + 65 cents = $1.95/h
    assert hourly_usd({"n0": 65, "n1": 65, "n2": 65}) == (pytest.approx(1.95), [])
    assert hourly_usd({"n0": 65, "n1": None, "n2": "x"}) == (None, ["n1", "n2"])
    assert hourly_usd({}) == (None, [])
    assert hourly_usd({"n0": 1e308, "n1": 1e308}) == (None, [])  # more than a float holds: no figure, no inf


def test_cost_per_million_generated_tokens_by_hand():
    # $1.95/h / 3600 s x 0.05 s per token x 1e6 tokens = $27.083...
    assert usd_per_mtok({"n0": 65, "n1": 65, "n2": 65}, 50.0) == pytest.approx(27.0833333)
    # one node at $0.65/h, 50 ms per token: $9.027...
    assert usd_per_mtok({"n0": 65}, 50) == pytest.approx(9.0277777)
    assert usd_per_mtok({"n0": 65, "n1": None}, 50.0) is None
    for ms in (None, 0, -1.0, float("nan"), float("inf"), True, "50"):
        assert usd_per_mtok({"n0": 65}, ms) is None
    assert usd_per_mtok({"n0": 1e300}, 1e300) is None
    # 1e20 cents = $1e18/h; / 3600 x 0.05 x 1e6 = $1.3889e19
    assert usd_per_mtok({"n0": 10 ** 20}, 50.0) == pytest.approx(1.3888889e19)


def test_a_records_prices_are_those_of_its_hosts():
    record = {"hosts": ["n0", "n1"], "price_cent_per_hour": {"n0": 65, "n2": 80}}
    assert record_prices(record) == {"n0": 65, "n1": None}
    assert record_prices({"hosts": ["n0"]}) == {"n0": None}


def records(started="2026-12-02T12:00:00Z", *finished):
    return [{"bench_started": started, "finished": moment, "hosts": ["n0"], "price_cent_per_hour": {"n0": 65}}
            for moment in finished]


def test_wall_time_runs_from_the_start_of_the_benchmark_to_its_last_run():
    assert wall_time_s(records("2026-12-02T12:00:00Z", "2026-12-02T12:01:00Z", "2026-12-02T12:03:42Z")) == 222.0
    assert wall_time_s(records("2026-12-02T12:00:00+00:00", "2026-12-02T13:00:00+01:00")) == 0.0
    assert wall_time_s(records("", "2026-12-02T12:01:00Z")) is None
    assert wall_time_s(records("yesterday", "2026-12-02T12:01:00Z")) is None
    assert wall_time_s(records("2026-12-02T12:05:00Z", "2026-12-02T12:01:00Z")) is None
    assert wall_time_s([]) is None


def test_the_run_cost_line():
    cost = run_cost({"n0": 65, "n1": 65, "n2": 65}, 222.0)
    assert cost["usd"] == pytest.approx(0.120250) and cost["nodes"] == 3
    assert cost_text(cost) == "$0.12 (3 nodes, $1.95/h together, 3 min 42 s of wall time)"
    assert cost_text(run_cost({"n0": 65}, 20.4)) == "< $0.01 (1 node, $0.65/h together, 20 s of wall time)"
    assert cost_text(run_cost({"n0": 65}, 3605.0)) == "$0.65 (1 node, $0.65/h together, 1 h 0 min 5 s of wall time)"


def test_a_node_without_a_price_makes_the_cost_unknown_naming_it():
    text = cost_text(run_cost({"n0": None, "n1": None, "n2": None}, 222.0))
    assert text == ("unknown (no price for n0, n1, n2: the inventory gives none; Glows inventories carry "
                    "glows_price_cent)")
    assert cost_text(run_cost({"n0": 65, "n1": None}, 222.0)).startswith("unknown (no price for n1:")
    assert cost_text(run_cost({"n0": 0, "n1": 65, "n2": "x"}, 222.0)).startswith("unknown (no price for n0, n2:")
    assert cost_text(run_cost({"n0": 65}, None)).startswith("unknown ($0.65/h together, but the records give no")
    assert cost_text(run_cost({}, 10.0)) == "unknown (no nodes)"
    assert cost_text(run_cost({"n0": 1e308, "n1": 1e308}, 10.0)).startswith("unknown (the nodes' prices add up")
    assert cost_text(run_cost({"n0": 1e306}, 1e306)) == "unknown (too large to compute)"


def test_prices_of_all_nodes_come_from_the_profile_else_the_records():
    profile = [{"host": "n0", "price_cent_per_hour": 65}, {"host": "n1"}]
    assert node_prices(profile, records("s", "f")) == {"n0": 65, "n1": None}
    both = records("s", "f") + [{"hosts": ["n0", "n1"], "price_cent_per_hour": {"n0": 70, "n1": 80}}]
    assert node_prices([], both) == {"n0": 65, "n1": 80}
    assert report_cost(records("2026-12-02T12:00:00Z", "2026-12-02T12:03:42Z"), []) == \
        "$0.04 (1 node, $0.65/h together, 3 min 42 s of wall time)"


@pytest.mark.parametrize("usd, text", [(None, "unknown"), (0.12025, "$0.12"), (0.0049, "< $0.01"), (0.005, "$0.01"),
                                       (0.0, "$0.00"), (27.08333, "$27.08"), (1234.5, "$1,234.50"), (2.105, "$2.11"),
                                       (0.125, "$0.13"), (0.135, "$0.14"), (1e15, "$1,000,000,000,000,000.00"),
                                       (1e300, "$1" + ",000" * 100 + ".00")])
def test_money_rounds_to_the_cent(usd, text):
    assert money(usd) == text


@pytest.mark.parametrize("cents, text", [(65, "0.65"), (65.5, "0.655"), (1, "0.01"), (0.01, "0.0001"),
                                         (123456, "1,234.56"), (0.005, "0.0001"), (10 ** 30, "10" + ",000" * 9 + ".00"),
                                         (None, "unknown"), ("x", "unknown"), (0, "unknown"),
                                         (True, "unknown")])
def test_price_cell_in_dollars_per_hour(cents, text):
    assert price_cell(cents) == text


def test_mtok_cell_says_unknown_only_for_a_missing_price():
    assert mtok_cell({"usd_per_mtok": 27.083, "price_cent_per_hour": {"n0": 65}}) == "$27.08"
    assert mtok_cell({"usd_per_mtok": None, "price_cent_per_hour": {"n0": None}}) == "unknown"
    assert mtok_cell({"usd_per_mtok": None, "price_cent_per_hour": {"n0": 65}}) == "—"


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (42.4, "42 s"), (59.6, "1 min 0 s"), (222, "3 min 42 s"),
                                           (3600, "1 h 0 min 0 s"), (90061, "25 h 1 min 1 s")])
def test_duration_text(seconds, text):
    assert duration_text(seconds) == text


def test_no_figure_is_ever_infinite_or_nan():
    for value in (usd_per_mtok({"n0": 1e308}, 1e308), run_cost({"n0": 1e308}, 1e308)["usd"]):
        assert value is None or math.isfinite(value)
