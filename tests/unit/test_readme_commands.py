"""tests/readme_commands.py: which text of a README is a command, how [...] expands, and that every command of
README.md is either run by tests/integration/test_readme_run_as_typed.py or excused with a reason."""

import os
import re
import shlex
import subprocess
import textwrap

import pytest
import yaml
from ansible.parsing.splitter import parse_kv

from ansible_collections.prima.cluster.tests import readme_commands as rc

REPO = rc.REPO


def texts(markdown):
    return [command.text for command in rc.extract(textwrap.dedent(markdown))]


# ---- rule 1: code blocks

def test_indented_and_fenced_blocks_hold_commands_and_prose_does_not():
    assert texts("""\
        Run `make demo` first (inline code is prose).

            make demo

        ```
        make test
        ```

        ```bash
        ansible-playbook site.yml
        ```
        """) == ["make demo", "make test", "ansible-playbook site.yml"]


def test_fenced_blocks_of_other_languages_hold_none():
    assert texts("""\
        ```yaml
        make: demo
        ```

        ```text
        1. The tunnel, in a terminal of its own:
        ssh -N -L 8080:127.0.0.1:8080 root@10.77.0.3
        ```

        ```console
        make test
        ```
        """) == []


def test_an_indented_block_needs_a_blank_line_before_it():
    # A line indented by 4 that continues a paragraph is the paragraph's (CommonMark: no interrupting).
    assert texts("""\
        A paragraph
            make demo
        """) == []


def test_a_block_inside_a_list_item_is_indented_beyond_the_items_content():
    assert texts("""\
        - An item whose text goes on
          over a second line:

              PRIMA_CPP_MIRROR=/path/to/prima.cpp.git make test

          More text of the item, not a block.
        - Another item:

          make demo (indented 2: the item's own paragraph, not a block)
        """) == ["PRIMA_CPP_MIRROR=/path/to/prima.cpp.git make test"]


# ---- rules 2 and 3: entries, continuation, comments

def test_continuation_by_indentation_and_by_backslash():
    assert texts("""\
        Synopsis:

            ansible-playbook bench.yml -e model=70b [-e runs=3]
                                       [-e links=1gbit,10gbit]
            ansible-playbook serve.yml \\
              -e state=status
            make test
        """) == ["ansible-playbook bench.yml -e model=70b [-e runs=3] [-e links=1gbit,10gbit]",
                 "ansible-playbook serve.yml -e state=status", "make test"]


def test_comments_are_not_part_of_the_command_and_belong_to_it():
    commands = rc.extract(textwrap.dedent("""\
        Two:

            make demo    # the sandbox, then
                         # site.yml on it
            make ready INVENTORY=inventory/sandbox-mapped.yml
            # = pytest tests/readiness --ansible-inventory=inventory/sandbox-mapped.yml
            curl -H 'X-Tag: #1' http://x/#frag "a # b"   # only this is a comment
        """))
    assert [command.text for command in commands] == [
        "make demo", "make ready INVENTORY=inventory/sandbox-mapped.yml",
        "curl -H 'X-Tag: #1' http://x/#frag \"a # b\""]
    assert commands[0].comments == ("the sandbox, then", "site.yml on it")
    assert commands[1].comments == ("= pytest tests/readiness --ansible-inventory=inventory/sandbox-mapped.yml",)
    assert commands[0].line == 3


def test_a_continued_comment_line_is_not_a_command():
    assert texts("""\
        Vault:

            ansible-vault create inventory/group_vars/cluster/vault.yml
                # vault_glows_root_password: "..."
            ansible-playbook site.yml
        """) == ["ansible-vault create inventory/group_vars/cluster/vault.yml", "ansible-playbook site.yml"]


# ---- rule 4: what is a command

@pytest.mark.parametrize("line", [
    "make demo", ". .venv/bin/activate", "PRIMA_CPP_MIRROR=/m PRIMA_CPP_VERSION=abc make test",
    "python3 plugins/perflog.py FILE", "tools/prima-mirror.sh", ".venv/bin/pytest tests/unit",
    "./configure.sh", "/usr/bin/env true", "ansible-galaxy collection install x.tar.gz"])
def test_commands(line):
    assert rc.is_command(line)


@pytest.mark.parametrize("line", [
    "galaxy.yml, meta/ the collection prima.cluster", "ansible.cfg       inventory, collections path",
    "site.yml          preflight, then provisioning", "inventory/        glows.glows.yml",
    "group_vars/all (model catalog)", "1. The tunnel, in a terminal of its own: ssh -N root@x",
    "models_catalog:", "- name: x", "| a | b |", "(the three builds through pinned_build), models",
    "-e runs=3", "<!-- variables:begin -->", "FOO=bar"])
def test_not_commands(line):
    assert not rc.is_command(line)


def test_a_file_listing_block_yields_nothing():
    assert texts("""\
        ## Layout

            galaxy.yml, meta/ the collection prima.cluster
            ansible.cfg       inventory, collections path
            roles/            one concern each: toolchain, zeromq, highs,
                              sandbox (with its tiny-model writer), source_archive
            tools/            prima-mirror.sh
        """) == []


# ---- rule 5: optional parts

def test_each_optional_part_is_present_in_one_variant_and_absent_in_the_other():
    text = "ansible-playbook bench.yml -e model=70b [-e runtime=llama_rpc,single] [-e runs=3] -v"
    every, none = rc.variants(text)
    assert every == "ansible-playbook bench.yml -e model=70b -e runtime=llama_rpc,single -e runs=3 -v"
    assert none == "ansible-playbook bench.yml -e model=70b -v"
    for start, end in rc.optional_parts(text):
        part = text[start + 1:end - 1]
        assert part in every and part not in none


def test_a_command_without_optional_parts_has_one_variant():
    assert rc.variants("make test") == ["make test"]


def test_brackets_inside_quotes_are_not_optional_parts():
    text = """ansible-playbook x.yml -e '{"launch_head_extra_args": ["--temp", "0.7"]}' [-e "a='[b]'"]"""
    assert rc.variants(text) == [
        """ansible-playbook x.yml -e '{"launch_head_extra_args": ["--temp", "0.7"]}' -e "a='[b]'\"""",
        """ansible-playbook x.yml -e '{"launch_head_extra_args": ["--temp", "0.7"]}'"""]


@pytest.mark.parametrize("text, said", [
    ("ansible-playbook serve.yml [-e runtime=prima|llama_rpc|single]", "is a pipe to bash"),
    ("ansible-playbook x.yml [-e a=1 [-e b=2]]", "not nested"),
    ("ansible-playbook x.yml [-e a=1", "[ without ]"),
    ("ansible-playbook x.yml -e a=1]", "] without ["),
])
def test_optional_parts_that_cannot_run_as_typed_are_refused(text, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        rc.variants(text)


# ---- the README itself

def test_every_readme_command_is_run_or_excused():
    commands = rc.readme_commands()
    missing = rc.unclassified(commands)
    assert not missing, ("README commands neither run nor excused; add each to CLASSIFICATION in "
                         "tests/readme_commands.py (by its exact text):\n" +
                         "\n".join("README.md:%d: %s" % (command.line, command.text) for command in missing))


def test_every_classified_command_is_still_in_the_readme():
    assert rc.stale(rc.readme_commands()) == []


def test_each_verdict_names_a_setup_or_a_reason():
    for text, verdict in rc.CLASSIFICATION.items():
        assert verdict.kind in (rc.RUN, rc.EXCUSED), text
        if verdict.kind == rc.RUN:
            assert verdict.detail in rc.SETUPS, text
        else:
            assert len(verdict.detail) > 20, text


def test_every_readme_command_runs_as_typed():
    """Each variant is one bash command line: balanced quotes, no optional part left, nothing bash would pipe."""
    for command in rc.readme_commands():
        for variant in rc.variants(command.text):
            assert "[" not in variant.split(" ")[0]
            checked = subprocess.run(["bash", "-n", "-c", variant], capture_output=True, text=True, check=False)
            assert checked.returncode == 0, (command.line, variant, checked.stderr)


def test_no_readme_value_with_a_space_reaches_ansible_split():
    """bash turns -e gpu='NVIDIA GeForce RTX 4090' into gpu=NVIDIA GeForce RTX 4090, of which Ansible's key=value
    parser keeps gpu=NVIDIA. Every -e of every README command, split as bash splits it, reaches Ansible's parser
    whole (or is JSON, or @file)."""
    for command in rc.readme_commands():
        for variant in rc.variants(command.text):
            argv = shlex.split(variant)
            for flag, value in zip(argv, argv[1:]):
                if flag not in ("-e", "--extra-vars") or value.startswith(("{", "[", "@")):
                    continue
                parsed = parse_kv(value)
                assert "_raw_params" not in parsed, ("README.md:%d: -e %s reaches Ansible as %r"
                                                     % (command.line, value, parsed))


def test_the_harness_sees_a_value_split_by_bash():
    argv = shlex.split("""ansible-playbook playbooks/glows-rent.yml -e gpu='NVIDIA GeForce RTX 4090'""")
    assert "_raw_params" in parse_kv(argv[-1])
    argv = shlex.split('ansible-playbook playbooks/glows-rent.yml -e "gpu=\'NVIDIA GeForce RTX 4090\'"')
    assert parse_kv(argv[-1]) == {"gpu": "NVIDIA GeForce RTX 4090"}


def test_the_collection_tarball_the_readme_names_is_the_version_galaxy_builds():
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        version = yaml.safe_load(handle)["version"]
    with open(rc.README) as handle:
        named = set(re.findall(r"prima-cluster-(\d[\w.]*)\.tar\.gz", handle.read()))
    assert named == {version}, "README names prima-cluster-%s.tar.gz; galaxy.yml builds %s" % (named, version)


def test_a_make_target_shown_with_its_equivalent_runs_that_command():
    """`make TARGET  # = COMMAND` in the README: make's recipe for TARGET runs COMMAND (the .venv's, first words)."""
    shown = [(command, comment[1:].strip()) for command in rc.readme_commands() for comment in command.comments
             if command.text.startswith("make ") and comment.startswith("=")]
    assert shown, "the README shows no make target with its equivalent"
    for command, equivalent in shown:
        dry = subprocess.run(["make", "-n", "--no-print-directory"] + command.text.split()[1:], cwd=REPO,
                             capture_output=True, text=True, check=True,
                             env=dict(os.environ, PRIMA_CPP_VERSION="")).stdout
        recipe = [line for line in dry.replace("\\\n", " ").splitlines() if line.strip()][-1]
        words = [re.sub(r"^\.venv/bin/", "", word) for word in shlex.split(recipe)]
        assert words[:len(shlex.split(equivalent))] == shlex.split(equivalent), (command.text, equivalent, recipe)
