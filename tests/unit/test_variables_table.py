"""The README's tables of variables are tools/variables_table.py's output, and meta/extra_vars.yml, which they are
made from, speaks for every playbook and every variable a playbook reads."""

import glob
import importlib.util
import os
import re

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")

_spec = importlib.util.spec_from_file_location("variables_table", os.path.join(REPO, "tools", "variables_table.py"))
assert _spec is not None and _spec.loader is not None
vt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vt)


def load(path):
    with open(os.path.join(REPO, path)) as handle:
        return yaml.safe_load(handle)


def test_the_readme_holds_the_generated_tables():
    with open(README) as handle:
        text = handle.read()
    assert vt.between(text) == vt.table(), "README.md's tables of variables are out of date: run make variables"
    assert vt.main(["--check", README]) == 0


def test_check_fails_on_a_table_that_differs(tmp_path):
    with open(README) as handle:
        text = handle.read()
    changed = tmp_path / "README.md"
    changed.write_text(text.replace("| `runs` | `3` |", "| `runs` | `4` |"))
    assert vt.main(["--check", str(changed)]) == 1
    assert vt.main(["--write", str(changed)]) == 0
    assert changed.read_text() == text


def test_replace_between_needs_both_markers():
    assert vt.replace_between("a\n%s\nold\n%s\nb\n" % (vt.BEGIN, vt.END), "new\n") == "a\n%s\nnew\n%s\nb\n" % (
        vt.BEGIN, vt.END)
    with pytest.raises(ValueError):
        vt.replace_between("a %s b" % vt.BEGIN, "new\n")


def test_every_role_input_is_listed_or_left_out_by_name():
    """Nothing drops out silently: each option of each role's main entry point is in a table, or in the line that
    names what is left out (or its role is)."""
    generated = vt.table()
    listed, left = vt.listed_role_inputs(REPO)
    for role, entry in vt.role_specs(REPO).items():
        for name in entry["options"]:
            in_table = "| `%s` |" % name in generated
            left_out = role in left["roles"] or name in left["required"] or name in left["set"]
            assert in_table != left_out, (role, name, in_table, left_out)


def test_cells_escape_pipes_and_defaults_are_shown():
    assert vt.cell("a | b\n c") == "a \\| b c"
    assert vt.role_default("x", "n", {"default": [1, 2]}, {}) == "`[1, 2]`"
    assert vt.role_default("x", "n", {}, {"n": ""}) == '`""`'
    assert vt.role_default("x", "n", {}, {"n": "y" * 80}) == "see roles/x/defaults/main.yml"
    assert vt.role_default("x", "n", {}, {}) == ""
    assert vt.markup(["C(direct) to", "I(each) peer"]) == "`direct` to each peer"


# ---- meta/extra_vars.yml: complete and well-formed

EXTRA = load("meta/extra_vars.yml")


def playbook_names():
    return {os.path.basename(path) for path in glob.glob(os.path.join(REPO, "playbooks", "*.yml"))}


@pytest.mark.parametrize("name", sorted(EXTRA["variables"]))
def test_each_playbook_variable_is_documented(name):
    entry = EXTRA["variables"][name]
    assert {"type", "default", "description", "playbooks"} <= set(entry), name
    assert entry["playbooks"] and set(entry["playbooks"]) <= playbook_names(), (name, entry["playbooks"])


@pytest.mark.parametrize("name", sorted(EXTRA["inventory_variables"]))
def test_each_inventory_variable_is_documented(name):
    assert {"type", "description"} <= set(EXTRA["inventory_variables"][name]), name


def test_it_speaks_for_every_playbook():
    listed = set(EXTRA["playbooks"])
    assert playbook_names() - {"command_line.yml"} <= listed, playbook_names() - listed
    tops = {os.path.basename(path) for path in glob.glob(os.path.join(REPO, "*.yml"))} - {"galaxy.yml"}
    assert tops <= listed, tops - listed


def task_names(tasks):
    """Facts a task list sets (set_fact) and results it registers, blocks included."""
    names = set()
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        if task.get("register"):
            names.add(task["register"])
        for key in ("ansible.builtin.set_fact", "set_fact"):
            if isinstance(task.get(key), dict):
                names |= set(task[key]) - {"cacheable"}
        for key in ("block", "rescue", "always"):
            names |= task_names(task.get(key))
    return names


def defined_names():
    """Every name a role or playbook defines: argument specs, defaults, vars, facts set and results registered."""
    names = set(EXTRA["variables"]) | set(EXTRA["inventory_variables"])
    for path in glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml")):
        for entry in (load(path)["argument_specs"] or {}).values():
            names |= set(entry.get("options") or {})
    for path in glob.glob(os.path.join(REPO, "roles", "*", "defaults", "main.yml")) + glob.glob(
            os.path.join(REPO, "roles", "*", "vars", "main.yml")):
        names |= set(load(path) or {})
    for path in glob.glob(os.path.join(REPO, "roles", "*", "tasks", "*.yml")) + glob.glob(
            os.path.join(REPO, "roles", "*", "handlers", "*.yml")):
        names |= task_names(load(path))
    for path in glob.glob(os.path.join(REPO, "playbooks", "*.yml")):
        for play in load(path) or []:
            names |= set(play.get("vars") or {}) | task_names(play.get("tasks"))
            for role in play.get("roles") or []:
                names |= set(role.get("vars") or {}) if isinstance(role, dict) else set()
    return names


def test_every_variable_a_playbook_or_role_default_reads_is_declared():
    """A variable read with `| default(...)` in a playbook or a role's defaults is someone's input: declared in
    meta/extra_vars.yml, or a role's own (argument specs, defaults, vars, facts)."""
    known = defined_names()
    readers = glob.glob(os.path.join(REPO, "playbooks", "*.yml")) + glob.glob(
        os.path.join(REPO, "roles", "*", "defaults", "main.yml"))
    missing = {}
    for path in readers:
        with open(path) as handle:
            for name in re.findall(r"(?<![\w.\]'\"])([a-z_][a-z0-9_]*)\s*\|\s*default\(", handle.read()):
                if name not in known and not name.startswith("ansible_"):
                    missing.setdefault(name, set()).add(os.path.relpath(path, REPO))
    assert missing == {}, "read but declared nowhere (add them to meta/extra_vars.yml): %s" % missing
