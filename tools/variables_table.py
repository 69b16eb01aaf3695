"""The README's table of the variables a person sets, made from meta/extra_vars.yml (the playbooks' own -e
variables and the inventory's) and every role's meta/argument_specs.yml (defaults from roles/*/defaults/main.yml
where the spec names none).

    python3 tools/variables_table.py                    # print the markdown
    python3 tools/variables_table.py --write README.md  # put it between the markers (make variables)
    python3 tools/variables_table.py --check README.md  # exit 1 when the README holds another table

Which role inputs are listed, by a rule the output states with the names it leaves out: the entry point main of
every role a playbook names (pinned_build, local_fact and source_archive are set by the roles that include
them), without the inputs marked required (the playbook or the including role passes them) and without those a
playbook sets itself in its vars (bench_runs from runs, serve_state from state, ...): give the playbook's
variable instead.
"""

import argparse
import glob
import json
import os
import re
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- variables:begin -->"
END = "<!-- variables:end -->"
MAX_DEFAULT = 50  # longer defaults are named by where they are written


def load_yaml(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader


def cell(text: Any) -> str:
    """Text for a table cell: one line, | escaped (GitHub splits cells on it even inside code spans)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return "%s%s%s%s%s" % (fence, pad, cell(text), pad, fence)


def markup(text: Any) -> str:
    """An argument spec's description (a string or a list of them), Ansible's C(...) and I(...) as markdown."""
    joined = " ".join(text) if isinstance(text, list) else str(text or "")
    joined = re.sub(r"\bC\(([^()]*)\)", r"`\1`", joined)
    return cell(re.sub(r"\b[IB]\(([^()]*)\)", r"\1", joined))


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def role_default(role: str, name: str, spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    if "default" in spec:
        value, where = spec["default"], None  # type: Any, Optional[str]
    elif name in defaults:
        value, where = defaults[name], "roles/%s/defaults/main.yml" % role
    else:
        return ""
    if value is None:
        return "none"
    text = value_text(value)
    if text == "":
        return '`""`'
    if len(text) > MAX_DEFAULT:
        return "see %s" % (where or "roles/%s/meta/argument_specs.yml" % role)
    return code(text)


def type_text(spec: Mapping[str, Any]) -> str:
    kind = str(spec.get("type", "str"))
    if spec.get("elements"):
        kind = "list of %s" % spec["elements"]
    if spec.get("choices"):
        kind += ": " + ", ".join(str(choice) for choice in spec["choices"])
    return cell(kind)


def playbook_default(value: Any) -> str:
    """meta/extra_vars.yml's defaults are values (3, prima) or words (none (required)): code for the first."""
    if value is None:
        return "none"
    text = value_text(value)
    if text != "none" and re.fullmatch(r"[\w.,:/~<>@-]+", text):
        return code(text)
    return cell(text)


def playbook_files(repo: str) -> List[str]:
    return sorted(glob.glob(os.path.join(repo, "playbooks", "*.yml")))


def roles_named(repo: str) -> Set[str]:
    """Every role a playbook runs: its roles: entries and its include_role / import_role tasks."""
    named = set()  # type: Set[str]
    for path in playbook_files(repo):
        for play in load_yaml(path) or []:
            for entry in play.get("roles") or []:
                named.add(str(entry["role"] if isinstance(entry, dict) else entry).split(".")[-1])
            for task in (play.get("tasks") or []) + (play.get("pre_tasks") or []) + (play.get("post_tasks") or []):
                for key in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role",
                            "import_role"):
                    if isinstance(task, dict) and key in task:
                        named.add(str(task[key]["name"]).split(".")[-1])
    # And the roles those depend on (transport runs as launch's dependency, in no play's roles: list).
    pending = sorted(named)
    while pending:
        meta = os.path.join(repo, "roles", pending.pop(), "meta", "main.yml")
        for entry in ((load_yaml(meta) or {}).get("dependencies") or []) if os.path.exists(meta) else []:
            role = str(entry["role"] if isinstance(entry, dict) else entry).split(".")[-1]
            if role not in named:
                named.add(role)
                pending.append(role)
    return named


def set_by_playbooks(repo: str) -> Dict[str, Set[str]]:
    """Variable -> the playbooks that set it in a play's or a role entry's vars."""
    found = {}  # type: Dict[str, Set[str]]
    for path in playbook_files(repo):
        for play in load_yaml(path) or []:
            scopes = [play.get("vars") or {}] + [entry.get("vars") or {} for entry in play.get("roles") or []
                                                 if isinstance(entry, dict)]
            for scope in scopes:
                for name in scope:
                    found.setdefault(name, set()).add(os.path.basename(path))
    return found


def role_specs(repo: str) -> Dict[str, Dict[str, Any]]:
    """Role -> {short_description, options: {name: spec}, defaults} of its entry point main."""
    roles = {}  # type: Dict[str, Dict[str, Any]]
    for path in sorted(glob.glob(os.path.join(repo, "roles", "*", "meta", "argument_specs.yml"))):
        role = path.split(os.sep)[-3]
        main = (load_yaml(path) or {}).get("argument_specs", {}).get("main") or {}
        defaults_path = os.path.join(repo, "roles", role, "defaults", "main.yml")
        defaults = (load_yaml(defaults_path) or {}) if os.path.exists(defaults_path) else {}
        roles[role] = {"short_description": main.get("short_description", ""),
                       "options": dict(main.get("options") or {}), "defaults": defaults}
    return roles


def listed_role_inputs(repo: str) -> Tuple[Dict[str, List[Tuple[str, Dict[str, Any]]]], Dict[str, List[str]]]:
    """(role -> [(name, spec)] listed, reason -> names or roles left out)."""
    named, set_vars = roles_named(repo), set_by_playbooks(repo)
    listed = {}  # type: Dict[str, List[Tuple[str, Dict[str, Any]]]]
    left = {"roles": [], "required": [], "set": []}  # type: Dict[str, List[str]]
    for role, entry in role_specs(repo).items():
        if role not in named:
            left["roles"].append(role)
            continue
        rows = []
        for name, spec in entry["options"].items():
            if spec.get("required"):
                left["required"].append(name)
            elif name in set_vars:
                left["set"].append(name)
            else:
                rows.append((name, spec))
        listed[role] = rows
    return listed, {key: sorted(set(names)) for key, names in left.items()}


def names(items: Sequence[str]) -> str:
    return ", ".join(code(item) for item in items)


def table(repo: str = REPO) -> str:
    extra = load_yaml(os.path.join(repo, "meta", "extra_vars.yml")) or {}
    roles = role_specs(repo)
    out = ["<!-- Made by tools/variables_table.py (make variables) from meta/extra_vars.yml and "
           "roles/*/meta/argument_specs.yml; edit those, not this. -->", "",
           "**On the command line**, each playbook's own (`-e NAME=value`; a value with spaces quoted inside "
           "the `-e`, or JSON):", "",
           "| Variable | Default | Type | Playbooks | What it does |", "|---|---|---|---|---|"]
    for name, entry in (extra.get("variables") or {}).items():
        kind = cell(entry.get("type", "str")) + (", comma-separated list" if entry.get("comma_list") else "")
        out.append("| %s | %s | %s | %s | %s |" % (
            code(name), playbook_default(entry.get("default")), kind,
            cell(", ".join(entry.get("playbooks") or [])), markup(entry.get("description"))))
    out += ["", "**In the inventory** (host or group variables; the `vault_` ones in the vault):", "",
            "| Variable | Default | Type | What it does |", "|---|---|---|---|"]
    for name, entry in (extra.get("inventory_variables") or {}).items():
        out.append("| %s | %s | %s | %s |" % (code(name), playbook_default(entry["default"]) if "default" in entry
                                              else "", cell(entry.get("type", "str")),
                                              markup(entry.get("description"))))
    listed, left = listed_role_inputs(repo)
    out += ["", "**Role inputs**, in the inventory or on the command line, by role. On the command line a number, "
            "boolean, list or mapping goes as JSON (`-e '{\"serve_restarts\": 5}'`): a key=value `-e` gives text, "
            "which only the inputs of `converted_role_inputs` in meta/extra_vars.yml take.", ""]
    for role, rows in listed.items():
        if not rows:
            continue
        out += ["<details><summary><code>%s</code>: %s (%d)</summary>" % (
            role, cell(roles[role]["short_description"]), len(rows)), "",
            "| Variable | Default | Type | What it does |", "|---|---|---|---|"]
        for name, spec in rows:
            out.append("| %s | %s | %s | %s |" % (code(name), role_default(role, name, spec, roles[role]["defaults"]),
                                                  type_text(spec), markup(spec.get("description"))))
        out += ["", "</details>", ""]
    out += ["Not listed: the inputs of the roles no playbook runs (%s: the roles that include them set them), the "
            "required inputs, which the playbooks pass (%s), and the inputs the playbooks set themselves, most from "
            "their own variables above (%s)." % (names(left["roles"]), names(left["required"]), names(left["set"]))]
    return "\n".join(out) + "\n"


def replace_between(text: str, generated: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError("the README needs exactly one %s and one %s after it" % (BEGIN, END))
    head, rest = text.split(BEGIN, 1)
    dummy, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + generated + END + tail


def between(text: str) -> str:
    """What the README holds between the markers (the generator's output when it is up to date)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0][1:]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="README", help="replace the table between the markers")
    group.add_argument("--check", metavar="README", help="exit 1 when the table between the markers differs")
    args = parser.parse_args(argv)
    generated = table()
    if not args.write and not args.check:
        sys.stdout.write(generated)
        return 0
    path = args.write or args.check
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if args.check:
        if between(text) != generated:
            sys.stderr.write("%s: the table of variables is out of date: run make variables\n" % path)
            return 1
        return 0
    updated = replace_between(text, generated)
    if updated != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
