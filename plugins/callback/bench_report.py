"""Callback plugin: bench.yml's parsed runs become results.jsonl, reports/<run-id>/report.md and a printed table."""

DOCUMENTATION = r"""
name: bench_report
type: aggregate
short_description: Aggregate bench.yml's runs into results.jsonl, a markdown report and a printed table
description:
  - Collects the C(bench_run_result) fact that bench.yml sets after each run (the head's perf
    figures, the split each rank used), the C(bench_run_results) of each server load test
    (bench.yml -e mode=server; its sequential requests and its concurrency levels) and the
    cluster profile (C(bench_profile)).
  - When the playbook ends without a failed or unreachable host, appends one JSON object per
    measured run to the results file (earlier lines are never rewritten), writes
    <reports dir>/<run id>/report.md (never over an existing one) and prints the main table.
  - After a failure it writes nothing and says where the raw logs are.
  - Parsing and aggregation are pure functions in plugins/plugin_utils/benchrun.py and benchreport.py.
requirements:
  - enabled in ansible.cfg (callbacks_enabled = prima.cluster.bench_report)
options:
  print_table:
    description: Print the main table when the playbook ends.
    type: bool
    default: true
    env:
      - name: PRIMA_BENCH_PRINT_TABLE
    ini:
      - section: bench_report
        key: print_table
  results_file:
    description: Name of the append-only file of measured runs, in the reports directory.
    type: str
    default: results.jsonl
    env:
      - name: PRIMA_BENCH_RESULTS_FILE
    ini:
      - section: bench_report
        key: results_file
"""

import os

from ansible.plugins.callback import CallbackBase

from ansible_collections.prima.cluster.plugins.plugin_utils.benchreport import append_results, render_report


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "prima.cluster.bench_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.runs = []
        self.profile = []
        self.repeated = []

    def v2_runner_on_ok(self, result):
        facts = result._result.get("ansible_facts") or {}
        if "bench_run_result" in facts:
            self.runs.append(facts["bench_run_result"])
        # bench.yml -e mode=server: one load test's records (its sequential requests, then its levels).
        if "bench_run_results" in facts:
            self.runs.extend(facts["bench_run_results"])
        if "bench_run_lost" in facts:
            self.repeated.append(facts["bench_run_lost"])
        if "bench_profile" in facts:
            self.profile = facts["bench_profile"]

    def v2_playbook_on_stats(self, stats):
        if not self.runs:
            return
        run_dir = self.runs[0]["run_dir"]
        if any(stats.failures.values()) or any(stats.dark.values()):
            self._display.warning("bench.yml failed: %s untouched, no report written; raw logs kept in %s/raw"
                                  % (self.get_option("results_file"), run_dir))
            return
        results = os.path.join(os.path.dirname(run_dir), self.get_option("results_file"))
        report_path = os.path.join(run_dir, "report.md")
        # The report first: if it cannot be made, results.jsonl stays as it was.
        text, main_table = render_report(self.runs, self.profile, self.repeated, plot_dir=run_dir)
        with open(report_path, "x", encoding="utf-8") as handle:
            handle.write(text)
        written = append_results(results, self.runs)
        if self.get_option("print_table"):
            self._display.display("\n" + main_table + "\n")
        self._display.display("bench report: %s (%d measured runs appended to %s)" % (report_path, written, results))
