"""Action: refuse the command line's -e values that would be lost or misread, before anything is touched.

Documented in plugins/modules/extra_vars.py; the checks are plugin_utils/extravars.py's.
"""

import yaml
from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.parsing.splitter import parse_kv
from ansible.plugins.action import ActionBase

from ansible_collections.prima.cluster.plugins.plugin_utils.extravars import (extra_vars_problems, our_playbooks,
                                                                              playbook_names, playbook_specs,
                                                                              playbooks_taking)
from ansible_collections.prima.cluster.plugins.plugin_utils.paths import collection_path
from ansible_collections.prima.cluster.plugins.plugin_utils.preflight import role_argument_specs


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        with open(collection_path("meta/extra_vars.yml")) as handle:
            extra_vars = yaml.safe_load(handle)
        playbooks = playbook_names(context.CLIARGS.get("args") or ())
        ours = set(our_playbooks(extra_vars))
        specs = playbook_specs(playbooks, extra_vars, role_argument_specs(collection_path("roles")))
        items = [str(item) for item in (context.CLIARGS.get("extra_vars") or ())]
        label = " ".join(playbooks) or "this playbook"
        problems = extra_vars_problems(items, label, specs, load_yaml=self._loader.load,
                                       load_file=self._loader.load_from_file, parse_kv=parse_kv,
                                       check_names=bool(playbooks) and set(playbooks) <= ours,
                                       elsewhere=playbooks_taking(extra_vars))
        if problems:
            raise AnsibleActionFail("\n".join(["%s was not started: fix these -e values first (nothing was touched):"
                                               % label] + ["- " + problem for problem in problems]))
        result.update(changed=False, checked=len(items), ansible_facts={"extra_vars_checked": True})
        return result
