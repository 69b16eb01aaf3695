"""Each fact has one owner: no role (or playbook) sets a fact that another role or playbook sets, so a value is
never overwritten behind its reader's back (bench once kept its plans under a second name because serve's
`up` replaced launch's). A task's `register` counts as setting its name."""

import os
from collections import defaultdict
from typing import Any, Dict, Set

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SET_FACT = ("ansible.builtin.set_fact", "set_fact")


def facts_set(tree: Any, found: Set[str]) -> Set[str]:
    """Every fact name a task tree sets with set_fact or register."""
    if isinstance(tree, list):
        for item in tree:
            facts_set(item, found)
    elif isinstance(tree, dict):
        for key, value in tree.items():
            if key in SET_FACT and isinstance(value, dict):
                found.update(name for name in value if name != "cacheable")
            elif key == "register" and isinstance(value, str):
                found.add(value)
            else:
                facts_set(value, found)
    return found


def owners() -> Dict[str, Set[str]]:
    """fact -> the roles (role NAME) and playbooks (playbooks/FILE) that set it."""
    found = defaultdict(set)  # type: Dict[str, Set[str]]
    roles = os.path.join(REPO, "roles")
    sources = [(os.path.join(root, name), "role " + os.path.relpath(root, roles).split(os.sep)[0])
               for root, dummy, names in os.walk(roles) for name in names
               if name.endswith(".yml") and os.path.basename(root) in ("tasks", "handlers")]
    sources += [(os.path.join(REPO, "playbooks", name), "playbooks/" + name)
                for name in os.listdir(os.path.join(REPO, "playbooks")) if name.endswith(".yml")]
    for path, owner in sources:
        with open(path) as handle:
            for fact in facts_set(yaml.safe_load(handle), set()):
                found[fact].add(owner)
    return found


def test_the_walk_finds_set_fact_and_register_at_any_depth():
    tasks = [{"name": "a", "ansible.builtin.set_fact": {"one": 1, "cacheable": True}},
             {"block": [{"name": "b", "register": "two", "ansible.builtin.command": {"argv": ["true"]}}],
              "always": [{"set_fact": {"three": 3}}]}]
    assert facts_set(tasks, set()) == {"one", "two", "three"}
    found = owners()
    assert found["launch_plans"] == {"role launch"} and found["bench_run_id"] == {"playbooks/bench.yml"}, (
        found["launch_plans"], found["bench_run_id"])


def test_no_fact_has_two_owners():
    shared = {fact: sorted(where) for fact, where in owners().items() if len(where) > 1}
    assert shared == {}, "facts set in more than one role or playbook: %s" % shared
