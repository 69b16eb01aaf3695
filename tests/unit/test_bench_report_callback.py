"""The bench_report callback, loaded by Ansible's own plugin loader and fed the events bench.yml sends it: what the
judging action and bench_write_report return (from real logs judged into a run directory), then the play's stats.
It only prints: the report and results.jsonl are written by bench.yml itself (test_benchrecords.py)."""

import os
from unittest import mock

import pytest
from ansible.executor.stats import AggregateStats
from ansible.plugins.loader import callback_loader

from test_benchrecords import SINGLE, SINGLE_LOG, action, judge


class Result:
    """What a callback receives for a task: the module's result as _result."""

    def __init__(self, outcome):
        self._result = outcome


@pytest.fixture()
def callback():
    plugin = callback_loader.get("prima.cluster.bench_report")
    plugin.set_options(direct={"print_table": True})
    plugin._display = mock.MagicMock()
    return plugin


def printed(callback):
    return "\n".join(str(call.args[0]) for call in callback._display.display.call_args_list)


def warned(callback):
    return "\n".join(str(call.args[0]) for call in callback._display.warning.call_args_list)


@pytest.fixture()
def judged_runs(tmp_path):
    run_dir = str(tmp_path / "r1")
    os.makedirs(os.path.join(run_dir, "raw"))
    return run_dir, [judge(run_dir, SINGLE, "unshaped/run%d" % index, [SINGLE_LOG], index) for index in (1, 2)]


def test_a_clean_playbook_prints_the_main_table_and_where_the_report_is(callback, judged_runs, tmp_path):
    run_dir, runs = judged_runs
    for outcome in runs:
        callback.v2_runner_on_ok(Result(outcome))
    written = action("prima.cluster.bench_write_report", {"run_dir": run_dir,
                                                          "results": str(tmp_path / "results.jsonl")}).run(task_vars={})
    callback.v2_runner_on_ok(Result(written))
    callback.v2_playbook_on_stats(AggregateStats())
    text = printed(callback)
    assert written["main_table"] in text and "| single node | tiny | unshaped |" in text
    assert "bench report: %s/report.md (2 measured runs appended to " % run_dir in text


def test_the_table_is_not_printed_when_turned_off(callback, judged_runs):
    run_dir, dummy = judged_runs
    callback.set_options(direct={"print_table": False})
    callback.v2_runner_on_ok(Result(action("prima.cluster.bench_write_report", {"run_dir": run_dir}).run(
        task_vars={})))
    callback.v2_playbook_on_stats(AggregateStats())
    assert printed(callback) == ""


def test_after_a_failure_it_says_where_the_raw_logs_are(callback, judged_runs):
    run_dir, runs = judged_runs
    callback.v2_runner_on_ok(Result(runs[0]))
    stats = AggregateStats()
    stats.increment("failures", "n1")
    callback.v2_playbook_on_stats(stats)
    assert warned(callback) == ("bench.yml failed: results.jsonl untouched, no report written; raw logs kept in "
                                "%s/raw" % run_dir)
    assert printed(callback) == "" and not os.path.exists(os.path.join(run_dir, "report.md"))


def test_a_playbook_without_runs_prints_nothing(callback):
    callback.v2_playbook_on_stats(AggregateStats())
    stats = AggregateStats()
    stats.increment("failures", "n1")
    callback.v2_playbook_on_stats(stats)
    assert printed(callback) == "" and warned(callback) == ""
