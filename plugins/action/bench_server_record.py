"""Action plugin: keep one server load test (bench.yml -e mode=server) under raw/, with what its records are made of.

Runs on the controller after prima.cluster.load_test ran on rank 0. The records are made by pure functions in
plugin_utils/bench/server.py; the documentation is in plugins/modules/bench_server_record.py.
"""

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.records import SERVER, keep_judged
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.run import PLAN_KEYS
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.server import (
    raw_result, sequential_problems, server_records)

ARGUMENT_SPEC = {
    "plan": {"type": "dict", "required": True},
    "result": {"type": "dict", "required": True},
    "raw_dir": {"type": "path", "required": True},
    "meta": {"type": "dict", "default": {}},
}


def raw_path(raw_dir, plan, link):
    """raw/<head>/<unit>/<link>/load.json: one load test per server unit and link step."""
    return os.path.join(raw_dir, plan["head"], plan["name"], str(link or "unshaped"), "load.json")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        plan, measured, meta = args["plan"], args["result"], args["meta"]
        missing = [key for key in PLAN_KEYS + ("head",) if key not in plan]
        if missing:
            raise AnsibleActionFail("bench_server_record: plan lacks %s; pass the serve role's serve_plan"
                                    % ", ".join(missing))
        # The load test ran with no_log (it carries the API key), so its own failure is told here.
        if measured.get("failed"):
            raise AnsibleActionFail("%s: the load test failed: %s" % (plan["name"], measured.get("msg", "")))
        path = raw_path(args["raw_dir"], plan, meta.get("link"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(raw_result(measured), handle, sort_keys=True, allow_nan=False)
            handle.write("\n")
        problems = sequential_problems(plan, measured)
        if problems:
            raise AnsibleActionFail("%s failed:\n%s\n(requests kept in %s; results.jsonl untouched)"
                                    % (plan["name"], "\n".join(problems), path))
        records = server_records(plan, measured, meta)
        for record in records:
            if record["mode"] == "server-load" and record["errors"]:
                self._display.warning("%s, %d clients: %d of %d requests failed: %s"
                                      % (plan["name"], record["clients"], record["errors"], record["requests"],
                                         "; ".join(record["error_samples"])))
        judged = keep_judged(args["raw_dir"], os.path.dirname(path), SERVER, plan, meta)
        result.update(changed=True, raw=path, judged=judged, run_dir=os.path.dirname(args["raw_dir"]),
                      records=records)
        return result
