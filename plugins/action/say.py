"""Action: print lines as they are, one per line, for commands a person pastes.

The default callback prints a debug message as YAML or JSON: a long line is folded and its quotes are doubled
or escaped, so a printed command no longer runs when pasted. Documented in plugins/modules/say.py.
"""

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec={
            "lines": {"type": "list", "elements": "str", "required": True}})
        lines = [str(line) for line in args["lines"]]
        display.display("\n".join(lines))
        result.update(changed=False, msg=lines)
        return result
