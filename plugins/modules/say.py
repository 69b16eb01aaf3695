# The action plugin plugins/action/say.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: say
short_description: Print lines as they are, for commands a person pastes
description:
  - Prints each line as it is, on a line of its own, under the task. No YAML folding, no JSON escaping, so a
    printed command works pasted as printed (the default callback's debug output folds long lines and doubles
    quotes).
  - Returns the lines as C(msg) too.
options:
  lines:
    description: The lines to print.
    type: list
    elements: str
    required: true
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Say how to reach the server
  prima.cluster.say:
    lines:
      - "The tunnel, in a terminal of its own:"
      - "ssh -N -L 8080:127.0.0.1:8080 -p 2210 root@10.77.0.3"
"""

RETURN = r"""
msg:
  description: The lines printed.
  type: list
  elements: str
  returned: always
"""
