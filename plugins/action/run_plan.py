"""Action: the run, computed once (plugin_utils/cluster/run_plan.py); documented in plugins/modules/run_plan.py.

bench.yml's and serve.yml's first controller play call it; it returns the run as the fact bench_run or serve_run,
which the plays after it read their parameters from.
"""

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.run_plan import RunPlanError, run_plan

VALUES = ("model", "runtime", "runs", "links", "mode", "clients", "state")

ARGUMENT_SPEC = dict(
    {name: {"type": "raw"} for name in VALUES},
    playbook={"type": "str", "required": True, "choices": ["bench", "serve"]},
    catalog={"type": "dict", "required": True},
    prima_built={"type": "bool", "required": True},
    api_key={"type": "raw", "no_log": True},
    hosts={"type": "list", "elements": "str", "default": []},
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        values = {name: args[name] for name in VALUES if args[name] is not None}
        try:
            plan = run_plan(args["playbook"], values, args["catalog"], args["prima_built"], args["api_key"],
                            args["hosts"], (task_vars or {}).get("hostvars") or {})
        except RunPlanError as error:
            raise AnsibleActionFail(str(error)) from None
        result.update(changed=False, ansible_facts={"%s_run" % args["playbook"]: plan}, run=plan)
        return result
