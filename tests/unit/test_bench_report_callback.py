"""The bench_report callback, loaded by Ansible's own plugin loader and fed the events bench.yml sends it:
the judging action's facts (records made by run_record from real logs), then the play's stats."""

import json
import os

import pytest
from ansible.executor.stats import AggregateStats
from ansible.plugins.loader import callback_loader

from ansible_collections.prima.cluster.plugins.plugin_utils.benchrun import run_record

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SINGLE_LOG = os.path.join(REPO, "tests", "fixtures", "perf", "llamacpp-single-llama-completion.stderr")
PLAN = {"name": "single-tiny", "runtime": "single", "model": "tiny", "world": 1, "hosts": ["n0"], "split": "1 node",
        "head": "n0", "units": {"n0": {"rank": 0, "role": "head"}}}


class Result:
    """What a callback receives for a task: the module's result as _result."""

    def __init__(self, facts):
        self._result = {"changed": False, "ansible_facts": facts}


def record(run_dir, index, **extra):
    with open(SINGLE_LOG) as handle:
        stderr = handle.read()
    ranks = [{"host": "n0", "rank": 0, "role": "head", "exit": 0, "stderr": stderr}]
    meta = {"run_id": os.path.basename(run_dir), "run_index": index, "warmup": index == 0, "link": "unshaped",
            "link_bits": 0, "run_dir": run_dir, "finished": "2026-12-03T00:00:00Z", "build": "0c1e570"}
    return run_record(PLAN, ranks, stderr, dict(meta, **extra))


@pytest.fixture()
def callback():
    plugin = callback_loader.get("prima.cluster.bench_report")
    plugin.set_options(direct={"print_table": False})
    return plugin


def events(callback, run_dir):
    profile = [{"rank": 0, "host": "n0", "gpu": "", "vram_gib": 0, "ram_gib": 1.0, "disk_read_gbs": 1.5, "cpu_cores": 2}]
    callback.v2_runner_on_ok(Result({"bench_profile": profile}))
    for index in range(3):
        callback.v2_runner_on_ok(Result({"bench_run_result": record(run_dir, index), "bench_run_attempt": 0}))
    callback.v2_runner_on_ok(Result({"bench_run_lost": {"unit": "single-tiny", "run": "run1",
                                                        "stderr": run_dir + "/raw/n0/single-tiny/run1/stderr"}}))


def test_a_clean_playbook_writes_the_report_and_appends_the_measured_runs(callback, tmp_path):
    run_dir = str(tmp_path / "r1")
    os.makedirs(run_dir)
    (tmp_path / "results.jsonl").write_text('{"earlier": 1}\n')
    events(callback, run_dir)
    callback.v2_playbook_on_stats(AggregateStats())
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert lines[0] == '{"earlier": 1}' and len(lines) == 3  # the warm-up is not a measured run
    measured = json.loads(lines[1])
    assert measured["runtime"] == "single" and measured["perf"]["eval_tps"] > 0 and measured["ms_per_token"] > 0
    report = (tmp_path / "r1" / "report.md").read_text()
    assert "| single node | tiny | unshaped | — | 1 | 1 node | 0c1e570 |" in report
    assert "| Rank 0 (n0) |" in report and "- single-tiny run1:" in report
    # A static inventory gives no price: the cost is unknown, and says which node has none.
    assert measured["usd_per_mtok"] is None and "| Price ($/h) | unknown |" in report
    assert "Cost of this run: unknown (no price for n0: the inventory gives none;" in report


def test_the_report_and_results_carry_the_cost_from_the_nodes_price(callback, tmp_path):
    run_dir = str(tmp_path / "r1")
    os.makedirs(run_dir)
    # What bench.yml's profile and bench_record's meta carry from a Glows inventory's glows_price_cent.
    profile = [{"rank": 0, "host": "n0", "gpu": "RTX 4090", "vram_gib": 24.0, "ram_gib": 42.0, "disk_read_gbs": 1.5,
                "cpu_cores": 10, "price_cent_per_hour": 65}]
    callback.v2_runner_on_ok(Result({"bench_profile": profile}))
    for index in range(2):
        callback.v2_runner_on_ok(Result({"bench_run_result": record(
            run_dir, index, bench_started="2026-12-02T23:50:00Z", price_cent_per_hour={"n0": 65})}))
    callback.v2_playbook_on_stats(AggregateStats())
    [line] = [json.loads(text) for text in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert line["price_cent_per_hour"] == {"n0": 65} and line["bench_started"] == "2026-12-02T23:50:00Z"
    # $0.65/h / 3600 x (ms per token / 1000) x 1e6
    assert line["usd_per_mtok"] == pytest.approx(0.65 / 3600 * line["ms_per_token"] / 1000 * 1e6)
    report = (tmp_path / "r1" / "report.md").read_text()
    # 23:50:00 to 00:00:00 at $0.65/h: $0.11
    assert "Cost of this run: $0.11 (1 node, $0.65/h together, 10 min 0 s of wall time)." in report
    assert "| Price ($/h) | 0.65 |" in report and "| $%.2f |" % line["usd_per_mtok"] in report


def test_an_existing_report_is_never_overwritten(callback, tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "report.md").write_text("kept\n")
    events(callback, str(run_dir))
    with pytest.raises(FileExistsError):
        callback.v2_playbook_on_stats(AggregateStats())
    assert (run_dir / "report.md").read_text() == "kept\n" and not (tmp_path / "results.jsonl").exists()


def test_after_a_failure_nothing_is_written(callback, tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    events(callback, str(run_dir))
    stats = AggregateStats()
    stats.increment("failures", "n1")
    callback.v2_playbook_on_stats(stats)
    assert not (run_dir / "report.md").exists() and not (tmp_path / "results.jsonl").exists()


def test_a_playbook_without_runs_writes_nothing(callback, tmp_path):
    callback.v2_playbook_on_stats(AggregateStats())
    assert os.listdir(tmp_path) == []
