"""Action plugin: report.md of a bench run directory from its records on disk, and its runs in results.jsonl.

The run directory's records are read back and the report rendered by plugin_utils/bench/records.py (pure
functions do the parsing and the tables); the documentation is in plugins/modules/bench_write_report.py.
"""

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.records import (
    RecordsError, again_name, newest_run_dir, write_report)

display = Display()

ARGUMENT_SPEC = {
    "run_dir": {"type": "path"},
    "reports_dir": {"type": "path"},
    "report": {"type": "path"},
    "again": {"type": "bool", "default": False},
    "results": {"type": "path"},
    "plots": {"type": "bool", "default": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC, required_one_of=[
            ["run_dir", "reports_dir"]])
        try:
            run_dir = args["run_dir"] or newest_run_dir(args["reports_dir"])
            run_dir = os.path.abspath(run_dir)
            report = args["report"] or os.path.join(run_dir, again_name() if args["again"] else "report.md")
            written = write_report(run_dir, report, args["results"], plots=args["plots"])
        except RecordsError as error:
            raise AnsibleActionFail("No report written: %s" % error) from error
        line = "bench report: %s" % written.report
        if written.results:
            line += " (%d measured runs appended to %s)" % (written.appended, written.results)
        display.display(line)
        result.update(changed=True, report=written.report, results=written.results, appended=written.appended,
                      main_table=written.main_table, run_dir=run_dir, msg=line)
        return result
