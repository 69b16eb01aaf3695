# The action plugin plugins/action/bench_write_report.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: bench_write_report
short_description: Write a bench run's report.md from its records on disk, and append its runs to results.jsonl
description:
  - Reads the run directory bench.yml wrote (C(profile.json), and the C(judged.json) beside each judged run's
    raw logs), parses every run's figures again from the raw logs and writes the report (never over an existing
    file). With C(results), appends one line per measured run there (earlier lines are never rewritten); without
    it, only the report is made (playbooks/report.yml, after a parser fix or on another machine).
  - Fails naming the file and the fix, before anything is written, when the report exists, the directory holds
    no judged run or a record cannot be read.
  - Prints where the report went; the bench_report callback, when enabled, prints the main table.
options:
  run_dir:
    description: The run's directory, C(<reports dir>/<run id>). One of C(run_dir) and C(reports_dir) is required.
    type: path
  reports_dir:
    description: Without C(run_dir), the run directory made last under this one (the newest with a C(raw/)).
    type: path
  report:
    description: Where the report goes; when unset, C(run_dir)/report.md, or with C(again) a new
      C(report-again-<UTC time>.md) beside it.
    type: path
  again:
    description: The report is made again (playbooks/report.yml); its default name is dated, beside the first.
    type: bool
    default: false
  results:
    description: The results file to append the measured runs to; nothing is appended when unset.
    type: path
  plots:
    description: Draw a link sweep's plots beside the report.
    type: bool
    default: true
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the report from the run's records
  prima.cluster.bench_write_report:
    run_dir: "{{ cluster_reports_dir }}/{{ bench_run_id }}"
    results: "{{ cluster_reports_dir }}/results.jsonl"
"""

RETURN = r"""
report:
  description: The report written.
  type: str
  returned: success
results:
  description: The results file appended to, or null.
  type: str
  returned: success
appended:
  description: How many measured runs were appended.
  type: int
  returned: success
main_table:
  description: The report's main table (markdown), which the bench_report callback prints.
  type: str
  returned: success
"""
