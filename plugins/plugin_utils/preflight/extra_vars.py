"""The command line's -e values as a person typed them, checked before a playbook touches anything.

Ansible reads `-e NAME=value` as key=value words: bash has already removed the quotes a person wrote, so
`-e gpu='NVIDIA GeForce RTX 4090'` arrives as `gpu=NVIDIA GeForce RTX 4090`, and Ansible keeps `gpu=NVIDIA`
and puts the other words in `_raw_params`, which nothing reads. A misspelled name (`-e rnus=2`) is taken as a
variable nobody reads either. Both would run on silently with a value the person did not give. And a value
given as key=value is always text: a role that does arithmetic on it fails mid-play unless it converts it.

So every -e item is read here the way Ansible reads it (ansible.utils.vars.load_extra_vars), item by item so
that a problem can quote what was typed, and checked against what the playbook and the collection's roles
take (meta/extra_vars.yml, roles/*/meta/argument_specs.yml).
"""

import difflib
import json
import re
from typing import Any, Callable, Dict, List, Mapping, Sequence

# Names a command line may always set: Ansible's own connection and interpreter variables.
ALWAYS_KNOWN = re.compile(r"ansible_[a-z0-9_]+")
# Types whose values a key=value -e cannot carry as such: it gives text.
NOT_TEXT = ("int", "float", "bool", "list", "dict", "raw")
KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
# What makes a value need quotes in a shell (and, inside the -e, for Ansible's key=value parser).
NEEDS_QUOTES = re.compile(r"[\s'\"\\;&|<>()$`*?\[\]{}#~!]")


def shell_quote(text: str) -> str:
    """`text` as one shell word, readable: bare where it can be, else single quotes."""
    if text and not NEEDS_QUOTES.search(text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def typed_form(name: str, value: Any) -> str:
    """The -e a person can paste to give `name` this value with its type: JSON, single-quoted for the shell."""
    return "-e " + shell_quote(json.dumps({name: value}))


def quoted_form(name: str, text: str) -> str:
    """The -e that gives `name` this text through bash and Ansible's key=value parser."""
    if "'" not in text:
        return "-e \"%s='%s'\"" % (name, text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
                                   .replace("`", "\\`"))
    return typed_form(name, text)


def split_value_problem(item: str, parsed: Mapping[str, Any], specs: Mapping[str, Mapping[str, Any]]) -> str:
    """The words of `item` that Ansible's key=value parser left without a name, and how to keep them."""
    leftover = str(parsed.get("_raw_params", ""))
    match = KEY_VALUE.fullmatch(item.strip())
    named = [key for key in parsed if key != "_raw_params"]
    if match and len(named) == 1 and named[0] == match.group(1):
        name, text = match.group(1), match.group(2)
        if (specs.get(name) or {}).get("comma_list"):
            words = [word for word in re.split(r"[\s,]+", text) if word]
            return ("-e %s: Ansible reads -e as key=value words, so it took %s=%s and dropped %s. %s is a "
                    "comma-separated list, without spaces: -e %s=%s"
                    % (shell_quote(item), name, shell_quote(str(parsed[name])), shell_quote(leftover), name, name,
                       shell_quote(",".join(words))))
        if (specs.get(name) or {}).get("type") == "list":
            return ("-e %s: Ansible reads -e as key=value words, so it took %s=%s and dropped %s. %s is a list: "
                    "give it as JSON, one item a word: %s"
                    % (shell_quote(item), name, shell_quote(str(parsed[name])), shell_quote(leftover), name,
                       typed_form(name, text.split())))
        return ("-e %s: Ansible reads -e as key=value words, so it took %s=%s and dropped %s (bash had removed "
                "any quotes around the value). Quote the value inside the -e: %s, or give JSON: %s"
                % (shell_quote(item), name, shell_quote(str(parsed[name])), shell_quote(leftover),
                   quoted_form(name, text), typed_form(name, text)))
    return ("-e %s: Ansible reads -e as key=value words; %s has no NAME= and would be dropped. Quote each value "
            "that holds a space inside the -e (-e \"name='a b'\"), or give JSON (-e '{\"name\": \"a b\"}')"
            % (shell_quote(item), shell_quote(leftover)))


def unknown_problem(name: str, playbook: str, known: Sequence[str], elsewhere: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = ("Did you mean %s? " % " or ".join(close)) if close else ""
    if elsewhere:
        hint = "It is a variable of %s. " % ", ".join(elsewhere) + hint
    return ("-e %s: %s takes no variable of that name, so it would be ignored. %sThe variables each playbook "
            "takes are in the README's table (\"Variables you set\")" % (name, playbook, hint))


def text_problem(name: str, text: str, kind: str) -> str:
    example = {"int": 0, "float": 0.0, "bool": False, "list": [], "dict": {}}.get(kind)
    try:
        value = json.loads(text)
    except ValueError:
        value = example
    kind_words = {"int": "a whole number", "float": "a number", "bool": "a boolean", "list": "a list",
                  "dict": "a mapping"}.get(kind, "of type " + kind)
    return ("-e %s=%s gives %s as text, and it is %s: give it typed, as JSON: %s"
            % (name, shell_quote(text), name, kind_words, typed_form(name, value)))


def item_data(item: str, load_yaml: Callable[[str], Any], load_file: Callable[[str], Any],
              parse_kv: Callable[[str], Dict[str, Any]]) -> Any:
    """One -e item read as ansible.utils.vars.load_extra_vars reads it."""
    if item.startswith("@"):
        return load_file(item[1:])
    if item[0] in "[{":
        return load_yaml(item)
    return parse_kv(item)


def extra_vars_problems(items: Sequence[str], playbook: str, specs: Mapping[str, Mapping[str, Any]],
                        load_yaml: Callable[[str], Any], load_file: Callable[[str], Any],
                        parse_kv: Callable[[str], Dict[str, Any]], check_names: bool = True,
                        elsewhere: Mapping[str, Sequence[str]] = None) -> List[str]:
    """What is wrong with the -e `items` given to `playbook`.

    `specs` maps every variable the playbook takes to {"type": ..., "text": bool}: `text` true where the
    playbook or role converts a key=value text itself (`runs=3`), false where only a typed value works.
    Items read from a file (-e @file) or as JSON/YAML keep their types: only their names are checked.
    Without `check_names` (a playbook of the user's own that imports ours: its variables are not known here),
    an unknown name passes. `elsewhere` names the other playbooks that take a name this one does not."""
    problems = []  # type: List[str]
    for item in items:
        if not item:
            continue
        key_value = not item.startswith("@") and item[0] not in "[{"
        try:
            data = item_data(item, load_yaml, load_file, parse_kv)
        except Exception as error:  # noqa: BLE001 - Ansible's loaders raise many kinds; each is this item's problem
            problems.append("-e %s cannot be read: %s" % (shell_quote(item), str(error).splitlines()[0][:300]))
            continue
        if not isinstance(data, Mapping):
            problems.append("-e %s is not NAME=value, JSON or @file with a mapping" % shell_quote(item))
            continue
        split = "_raw_params" in data
        if split:
            problems.append(split_value_problem(item, data, specs))
        for name, value in data.items():
            if name == "_raw_params" or (split and len(data) == 2):
                continue
            if ALWAYS_KNOWN.fullmatch(str(name)):
                continue
            spec = specs.get(name)
            if spec is None:
                if check_names:
                    problems.append(unknown_problem(str(name), playbook, sorted(specs),
                                                    (elsewhere or {}).get(str(name), [])))
            elif key_value and not spec.get("text") and spec.get("type", "str") in NOT_TEXT:
                problems.append(text_problem(str(name), str(value), str(spec.get("type"))))
    return problems


def playbook_names(args: Sequence[str]) -> List[str]:
    """The collection's names (bench.yml) of the playbooks on an ansible-playbook command line: a path, or the
    installed collection's prima.cluster.bench."""
    names = []  # type: List[str]
    for arg in args:
        base = str(arg).replace("\\", "/").rsplit("/", 1)[-1]
        if base.startswith("prima.cluster."):
            base = base[len("prima.cluster."):]
        names.append(base if base.endswith((".yml", ".yaml")) else base + ".yml")
    return names


def our_playbooks(extra_vars: Mapping[str, Any]) -> List[str]:
    """Every playbook of the collection that meta/extra_vars.yml speaks for."""
    return sorted({name for entry in (extra_vars.get("variables") or {}).values()
                   for name in entry.get("playbooks") or []} | set(extra_vars.get("playbooks") or []))


def playbook_specs(playbooks: Sequence[str], extra_vars: Mapping[str, Any],
                   role_specs: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Every variable `playbooks` take from the command line: their own (meta/extra_vars.yml, `playbooks`
    naming them), every role input of the collection, and the inventory variables the README documents."""
    specs = {}  # type: Dict[str, Dict[str, Any]]
    converted = set(extra_vars.get("converted_role_inputs") or [])
    for options in role_specs.values():
        for name, option in options.items():
            specs[name] = {"type": option.get("type", "str"), "text": name in converted}
    for name, entry in (extra_vars.get("inventory_variables") or {}).items():
        specs[name] = {"type": entry.get("type", "str"), "text": bool(entry.get("text"))}
    for name, entry in (extra_vars.get("variables") or {}).items():
        if set(playbooks) & set(entry.get("playbooks") or []):
            # A playbook's own variable is read by its plays, which convert what they take.
            specs[name] = {"type": entry.get("type", "str"), "text": True,
                           "comma_list": bool(entry.get("comma_list"))}
    return specs


def playbooks_taking(extra_vars: Mapping[str, Any]) -> Dict[str, List[str]]:
    """Each playbook variable of meta/extra_vars.yml, with the playbooks that take it."""
    return {name: list(entry.get("playbooks") or []) for name, entry in (extra_vars.get("variables") or {}).items()}


def sibling_playbook(arg: str, playbook: str) -> str:
    """`playbook` (serve.yml) where the command line's playbook `arg` is: beside it, or the installed
    collection's prima.cluster.serve for prima.cluster.bench."""
    if arg.startswith("prima.cluster."):
        return "prima.cluster." + playbook.rsplit(".", 1)[0]
    return arg.rsplit("/", 1)[0] + "/" + playbook if "/" in arg else playbook


def rerun_command(cli: Mapping[str, Any], extra: Sequence[str], playbook: str = "") -> str:
    """The ansible-playbook line that runs this run's playbooks again (or `playbook` beside them), on the same
    inventory with the same vault and limit, with `extra` (like `-e state=status`) instead of this run's -e
    values: what a hint prints, so that it works pasted as printed."""
    argv = ["ansible-playbook"]
    for source in cli.get("inventory") or ():
        argv += ["-i", str(source)]
    if cli.get("subset"):
        argv += ["--limit", str(cli["subset"])]
    for vault_id in cli.get("vault_ids") or ():
        argv += ["--vault-id", str(vault_id)]
    for password_file in cli.get("vault_password_files") or ():
        argv += ["--vault-password-file", str(password_file)]
    if cli.get("ask_vault_pass"):
        argv.append("--ask-vault-pass")
    args = [str(arg) for arg in cli.get("args") or ()]
    argv += [sibling_playbook(args[0], playbook)] if playbook and args else args
    return " ".join(shell_quote(arg) for arg in argv + list(extra))


def command_line_problems(cli: Mapping[str, Any], extra_vars: Mapping[str, Any],
                          role_specs: Mapping[str, Mapping[str, Any]], load_yaml: Callable[[str], Any],
                          load_file: Callable[[str], Any], parse_kv: Callable[[str], Dict[str, Any]]) -> List[str]:
    """The -e problems of a whole command line (ansible.context.CLIARGS), with the line that says what was not
    started first; empty when there are none. The extra_vars action and the Glows inventory (before it calls the
    API) both ask this."""
    playbooks = playbook_names(cli.get("args") or ())
    items = [str(item) for item in (cli.get("extra_vars") or ())]
    label = " ".join(playbooks) or "this command"
    problems = extra_vars_problems(items, label, playbook_specs(playbooks, extra_vars, role_specs),
                                   load_yaml=load_yaml, load_file=load_file, parse_kv=parse_kv,
                                   check_names=bool(playbooks) and set(playbooks) <= set(our_playbooks(extra_vars)),
                                   elsewhere=playbooks_taking(extra_vars))
    if not problems:
        return []
    return ["%s was not started: fix these -e values first (nothing was touched):" % label] + \
        ["- " + problem for problem in problems]


def this_command_line_problems(loader: Any) -> List[str]:
    """command_line_problems of this process's own command line, with the collection's meta/extra_vars.yml and
    role argument specs; `loader` is Ansible's DataLoader (for -e @file and JSON items)."""
    import yaml
    from ansible import context
    from ansible.parsing.splitter import parse_kv

    from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.paths import collection_path
    from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import role_argument_specs

    with open(collection_path("meta/extra_vars.yml")) as handle:
        extra_vars = yaml.safe_load(handle)
    return command_line_problems(context.CLIARGS, extra_vars, role_argument_specs(collection_path("roles")),
                                 load_yaml=loader.load, load_file=loader.load_from_file, parse_kv=parse_kv)
