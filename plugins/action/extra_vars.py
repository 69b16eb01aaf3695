"""Action: refuse the command line's -e values that would be lost or misread, before anything is touched.

Documented in plugins/modules/extra_vars.py; the checks are plugin_utils/preflight/extra_vars.py's.
"""

from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.extra_vars import this_command_line_problems


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        problems = this_command_line_problems(self._loader)
        if problems:
            raise AnsibleActionFail("\n".join(problems))
        result.update(changed=False, checked=len(context.CLIARGS.get("extra_vars") or ()),
                      ansible_facts={"extra_vars_checked": True})
        return result
