"""The command line's -e values as typed: lost words, unknown names and untyped text refused, with the fix."""

import glob
import os
import re
import subprocess
import sys

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.splitter import parse_kv

from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import (
    role_argument_specs, runtimes_problems, runtimes_selection)
from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.extra_vars import (
    extra_vars_problems, our_playbooks, playbook_names, playbook_specs, playbooks_taking, rerun_command)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(REPO, "meta", "extra_vars.yml")) as _handle:
    EXTRA_VARS = yaml.safe_load(_handle)
ROLE_SPECS = role_argument_specs(os.path.join(REPO, "roles"))
VENV_BIN = os.path.dirname(sys.executable)


def problems(items, playbook="bench.yml", **kwargs):
    loader = DataLoader()
    specs = playbook_specs([playbook], EXTRA_VARS, ROLE_SPECS)
    return extra_vars_problems(items, playbook, specs, load_yaml=loader.load, load_file=loader.load_from_file,
                               parse_kv=parse_kv, elsewhere=playbooks_taking(EXTRA_VARS), **kwargs)


def test_a_value_split_by_bash_is_refused_with_the_quoted_and_json_forms():
    # What bash hands over for -e gpu='NVIDIA GeForce RTX 4090'.
    found = problems(["count=3", "gpu=NVIDIA GeForce RTX 4090"], "glows-rent.yml")
    assert len(found) == 1, found
    assert "took gpu=NVIDIA and dropped 'GeForce RTX 4090'" in found[0]
    assert """-e "gpu='NVIDIA GeForce RTX 4090'\"""" in found[0]
    assert """-e '{"gpu": "NVIDIA GeForce RTX 4090"}'""" in found[0]


def test_the_suggested_forms_survive_bash_and_give_the_whole_value():
    found = problems(["gpu=NVIDIA GeForce RTX 4090"], "glows-rent.yml")[0]
    for form in re.findall(r"""(-e "gpu='[^']*'"|-e '\{[^']*\}')""", found):
        argv = subprocess.run(["bash", "-c", "printf '%s\\n' " + form], capture_output=True, text=True,
                              check=True).stdout.splitlines()
        assert argv[0] == "-e"
        item = argv[1]
        data = DataLoader().load(item) if item.startswith("{") else parse_kv(item)
        assert data == {"gpu": "NVIDIA GeForce RTX 4090"}, form
        assert problems([item], "glows-rent.yml") == []


def test_a_comma_list_split_by_a_space_is_told_to_drop_the_space():
    found = problems(["model=tiny", "links=1gbit 10gbit"])
    assert found == ["-e 'links=1gbit 10gbit': Ansible reads -e as key=value words, so it took links=1gbit and "
                     "dropped 10gbit. links is a comma-separated list, without spaces: -e links=1gbit,10gbit"]


def test_words_lost_from_a_role_input_are_refused():
    found = problems(["launch_head_extra_args=--top-k 1"])
    assert len(found) == 1 and "dropped 1" in found[0], found
    assert """-e '{"launch_head_extra_args": ["--top-k", "1"]}'""" in found[0]


def test_an_unknown_name_is_refused_with_the_closest_spelling():
    assert problems(["rnus=2"]) == [
        "-e rnus: bench.yml takes no variable of that name, so it would be ignored. Did you mean runs? The variables "
        "each playbook takes are in the README's table (\"Variables you set\")"]
    assert "model?" in problems(["modle=70b"])[0]


def test_another_playbooks_variable_is_named_as_such():
    found = problems(["count=3"], "bench.yml")
    assert "It is a variable of glows-rent.yml." in found[0]


def test_known_names_in_every_form_pass(tmp_path):
    extra = tmp_path / "vars.yml"
    extra.write_text("model: tiny\nruns: 2\nlaunch_timeout_s: 60\n")
    assert problems(["model=tiny", "runs=2", "runtime=llama_rpc,single", "bench_warmup_runs=0",
                     '{"launch_timeout_s": 600}', "@" + str(extra), "ansible_user=root", "links=1gbit,10gbit"]) == []


def test_text_for_a_typed_role_input_is_refused_unless_its_role_converts_it():
    found = problems(["launch_timeout_s=600"])
    assert found == ["-e launch_timeout_s=600 gives launch_timeout_s as text, and it is a whole number: give it "
                     "typed, as JSON: -e '{\"launch_timeout_s\": 600}'"]
    assert problems(['{"launch_timeout_s": 600}']) == []
    assert problems(["bench_warmup_runs=0"]) == []


def test_unreadable_items_are_problems_not_crashes(tmp_path):
    assert "cannot be read" in problems(["@" + str(tmp_path / "missing.yml")])[0]
    assert "cannot be read" in problems(['{"model": '])[0]
    assert "not NAME=value" in problems(["[1, 2]"])[0]


def test_a_playbook_of_ones_own_is_checked_for_lost_words_only():
    assert problems(["my_own_var=1"], check_names=False) == []
    assert problems(["my_own=a b"], check_names=False)


def test_playbook_names_from_a_command_line():
    assert playbook_names(["bench.yml", "/x/playbooks/site.yml", "prima.cluster.serve"]) == [
        "bench.yml", "site.yml", "serve.yml"]


def test_every_playbook_checks_its_command_line_first_and_is_spoken_for():
    ours = set(our_playbooks(EXTRA_VARS))
    for path in sorted(glob.glob(os.path.join(REPO, "playbooks", "*.yml"))):
        name = os.path.basename(path)
        if name in ("command_line.yml", "preflight.yml"):
            continue
        with open(path) as handle:
            plays = yaml.safe_load(handle)
        assert plays[0].get("ansible.builtin.import_playbook") == "command_line.yml", name
        assert name in ours, "%s is not in meta/extra_vars.yml's playbooks" % name
    assert ours <= {os.path.basename(path) for path in glob.glob(os.path.join(REPO, "playbooks", "*.yml"))}


def test_every_variable_a_playbook_reads_from_the_command_line_is_declared():
    """A bare `name | default(...)` in a playbook or a role default reads the command line: each must be in
    meta/extra_vars.yml, or it would be refused as unknown."""
    declared = set(EXTRA_VARS["variables"]) | set(EXTRA_VARS["inventory_variables"])
    options = {name for spec in ROLE_SPECS.values() for name in spec}
    read = set()
    for path in glob.glob(os.path.join(REPO, "playbooks", "*.yml")) + \
            glob.glob(os.path.join(REPO, "roles", "*", "defaults", "main.yml")):
        with open(path) as handle:
            for match in re.finditer(r"(?<![.\w'\[])([a-z][a-z0-9_]*) \| default\(", handle.read()):
                read.add(match.group(1))
    roles = os.listdir(os.path.join(REPO, "roles"))
    # A role's facts (cuda_available, toolchain_cc) and a play's own names are not the command line's.
    local = {name for name in read if re.match(r"(preflight|bench_input|serve_input|hostvars|item)", name)
             or any(name.startswith(role + "_") for role in roles)}
    missing = sorted(read - declared - options - local)
    assert missing == [], "read from the command line but not declared in meta/extra_vars.yml: %s" % missing


@pytest.mark.parametrize("value,expected", [
    ("all", []), ("prima", []), ("llama_rpc,single", []), (["single", "prima"], []),
])
def test_runtimes_accept_a_list_or_all(value, expected):
    assert runtimes_problems(value) == expected


def test_runtimes_refuse_unknown_repeated_and_mixed_all():
    assert "runtime 'vllm' is not one of" in runtimes_problems("single,vllm")[0]
    assert "twice" in runtimes_problems("single,single")[0]
    assert "stands alone" in runtimes_problems("all,single")[0]


def test_runtimes_selection_keeps_the_order_given_and_all_is_every_runtime_built():
    assert runtimes_selection("single,llama_rpc", True) == ["single", "llama_rpc"]
    assert runtimes_selection("all", False) == ["llama_rpc", "single"]
    assert runtimes_selection("all", True) == ["prima", "llama_rpc", "single"]


def run_typed(command, tmp_path):
    """A command line run through bash as a person types it, with an inventory whose only node cannot be reached
    (port 9 on loopback) and a Glows API that is not there: a problem found before anything is touched is all
    that can come out green, and anything that touched a node or the API would say so."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  children:\n    cluster:\n      hosts:\n        n0:\n          ansible_host: 127.0.0.1\n"
                         "          ansible_port: 9\n          cluster_ip: 127.0.0.1\n")
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"],
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               GLOWS_API_URL="http://127.0.0.1:9/sdk/v1", GLOWS_SDK_TOKEN="t" * 20,
               GLOWS_RENTAL_FILE=str(tmp_path / "rental.json"), INV=str(inventory))
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("command,expected", [
    ("""ansible-playbook playbooks/glows-rent.yml -e count=3 -e gpu='NVIDIA GeForce RTX 4090'""",
     """Quote the value inside the -e: -e "gpu='NVIDIA GeForce RTX 4090'\""""),
    ("""ansible-playbook -i "$INV" bench.yml -e model=tiny -e rnus=2""", "Did you mean runs?"),
    ("""ansible-playbook -i "$INV" bench.yml -e modle=70b""", "model?"),
    ("""ansible-playbook -i "$INV" bench.yml -e model=tiny -e links="1gbit 10gbit\"""",
     "-e links=1gbit,10gbit"),
    ("""ansible-playbook -i "$INV" bench.yml -e model=tiny -e launch_head_extra_args="--top-k 1\"""",
     """-e '{"launch_head_extra_args": ["--top-k", "1"]}'"""),
    ("""ansible-playbook -i "$INV" site.yml -e launch_timeout_s=600""", """-e '{"launch_timeout_s": 600}'"""),
    ("""ansible-playbook playbooks/glows-release.yml -e prefx=prima-a""", "Did you mean prefix?"),
])
def test_a_mistyped_command_stops_before_any_node_or_api_call(command, expected, tmp_path):
    result = run_typed(command, tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert expected in out, out
    assert "fix these -e values first (nothing was touched)" in out, out
    recap = out[out.index("PLAY RECAP"):]
    assert "n0" not in recap and "unreachable=1" not in recap, out
    assert not (tmp_path / "rental.json").exists()


def test_the_glows_inventory_calls_no_api_for_a_mistyped_command(tmp_path):
    """The inventory plugin lists instances before any play runs: it checks the -e values first."""
    result = run_typed("ansible-playbook -i inventory/sandbox-glows.glows.yml bench.yml -e model=tiny -e rnus=2",
                       tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "fix these -e values first" in out and "Did you mean runs?" in out, out
    assert "18780" not in out and "cannot reach" not in out, out


def test_the_rent_command_as_the_readme_spells_it_passes_the_check(tmp_path):
    """The quoted form gets past the check with the whole GPU name, and then fails at the API, which is not
    there: proof that the check let it through."""
    result = run_typed("""ansible-playbook playbooks/glows-rent.yml -e count=3 -e "gpu='NVIDIA GeForce RTX 4090'\"""",
                       tmp_path)
    out = result.stdout + result.stderr
    assert "fix these -e values first" not in out, out
    assert result.returncode != 0 and "127.0.0.1:9" in out, out


def test_a_hint_runs_the_same_playbook_on_the_same_inventory_with_its_vault():
    cli = {"inventory": ("/work/inv/sandbox-mapped.yml", "extra hosts,"), "args": ("playbooks/serve.yml",),
           "vault_password_files": ("/root/.vault pass",), "ask_vault_pass": False, "subset": "n0:n1",
           "extra_vars": ("model=tiny",)}
    assert rerun_command(cli, ["-e", "state=status"]) == (
        "ansible-playbook -i /work/inv/sandbox-mapped.yml -i 'extra hosts,' --limit n0:n1 --vault-password-file "
        "'/root/.vault pass' playbooks/serve.yml -e state=status")
    assert rerun_command(dict(cli, args=("bench.yml",), subset=None, vault_password_files=(), ask_vault_pass=True),
                         ["-e", "state=stopped"], playbook="serve.yml") == (
        "ansible-playbook -i /work/inv/sandbox-mapped.yml -i 'extra hosts,' --ask-vault-pass serve.yml -e state=stopped")
    assert rerun_command({"args": ("prima.cluster.bench",)}, [], playbook="serve.yml") == (
        "ansible-playbook prima.cluster.serve")


def test_a_hint_pasted_into_bash_gives_the_same_words():
    cli = {"inventory": ("/tmp/my inventory;rm -rf x.yml",), "args": ("serve.yml",)}
    line = rerun_command(cli, ["-e", "state=status"])
    argv = subprocess.run(["bash", "-c", 'printf "%s\\n" ' + line], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert argv == ["ansible-playbook", "-i", "/tmp/my inventory;rm -rf x.yml", "serve.yml", "-e", "state=status"]
