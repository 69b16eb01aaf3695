# The action plugin plugins/action/bench_record.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: bench_record
short_description: Judge one benchmark run from every rank's logs and keep what it read beside them
description:
  - Runs on the controller after bench.yml fetched each rank's C(run.tar) into C(raw_dir)/<host>/<unit>/<run_label>/.
    Unpacks them, judges the run (every failed rank named, cause first, with host, exit status and its meaning,
    and the last lines of its stderr) and parses the head's perf lines.
  - A good run writes C(judged.json) in the head's log directory (the plan, each rank's state and C(meta)).
    The report is made from those files and the raw logs (M(prima.cluster.bench_write_report)), not from facts.
  - A head that exited 0 with its log cut before the perf lines sets C(bench_run_attempt) to the next attempt
    while fewer than C(retries) attempts were made, and writes C(lost.json) naming the cut log; then it fails.
  - Any failed rank fails the task and leaves the raw logs where they are.
options:
  plan:
    description: The unit's plan, an entry of the launch role's C(launch_plans) (name, runtime, model, world, hosts, split).
    type: dict
    required: true
  ranks:
    description: What each rank's host reported (C(prima.cluster.bench_rank_reports)).
    type: list
    elements: dict
    required: true
  raw_dir:
    description: Controller directory the ranks' files were fetched into.
    type: path
    required: true
  run_label:
    description: The run's directory below <host>/<unit>/, like C(unshaped/warmup0), C(1gbit/run1) or C(unshaped/run1-retry1).
    type: str
    required: true
  meta:
    description: Copied into the record (run id, run index, link, model facts, network, ...).
    type: dict
    default: {}
  tail_lines:
    description: Lines of a failed rank's stderr quoted in the error.
    type: int
    default: 15
  retries:
    description: Attempts after the first for a run whose head log was cut at exit.
    type: int
    default: 0
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Judge the run and parse its figures
  prima.cluster.bench_record:
    plan: "{{ bench_plan }}"
    ranks: "{{ bench_plan | prima.cluster.bench_rank_reports(hostvars) }}"
    raw_dir: "{{ bench_raw_dir }}"
    run_label: unshaped/run1
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
record:
  description: The run's record (perf figures, world, split, the layers each prima.cpp rank used, meta).
  type: dict
  returned: when the run succeeded
judged:
  description: The judged.json written beside the head's logs.
  type: str
  returned: when the run succeeded
run_dir:
  description: The run directory (the parent of C(raw_dir)).
  type: str
  returned: always
lost:
  description: The unit, run and head stderr of a run whose log was cut, when it is tried again.
  type: dict
  returned: when the run is tried again
"""
