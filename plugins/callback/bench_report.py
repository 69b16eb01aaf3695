"""Callback plugin: bench.yml's main table on the console when the playbook ends, or where its raw logs are."""

DOCUMENTATION = r"""
name: bench_report
type: aggregate
short_description: Print bench.yml's main table when it ends
description:
  - bench.yml writes its report and results.jsonl itself, from the records kept beside each run's raw logs
    (action prima.cluster.bench_write_report), whether or not this callback is enabled.
  - When the playbook ends without a failed or unreachable host, this callback prints the report's main table
    and where the report is.
  - After a failure it says that no report was written and where the raw logs are.
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
"""

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "prima.cluster.bench_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.run_dir = None
        self.written = None

    def v2_runner_on_ok(self, result):
        # The judging actions name the run directory; bench_write_report says what it wrote.
        outcome = result._result
        if outcome.get("run_dir"):
            self.run_dir = outcome["run_dir"]
        if "main_table" in outcome and "report" in outcome:
            self.written = outcome

    def v2_playbook_on_stats(self, stats):
        if any(stats.failures.values()) or any(stats.dark.values()):
            if self.run_dir and not self.written:
                self._display.warning("bench.yml failed: results.jsonl untouched, no report written; raw logs kept "
                                      "in %s/raw" % self.run_dir)
            return
        if self.written and self.get_option("print_table"):
            self._display.display("\n" + self.written["main_table"] + "\n")
            self._display.display(self.written["msg"])
