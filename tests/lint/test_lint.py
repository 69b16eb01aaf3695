"""The house rules that tools can check: yamllint, ansible-lint (production), syntax."""

import glob
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def run_tool(*argv):
    return subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)


def test_yamllint_is_clean():
    result = run_tool(os.path.join(BIN, "yamllint"), "--strict", ".")
    assert result.returncode == 0, result.stdout


def test_ansible_lint_production_profile_is_clean():
    result = run_tool(os.path.join(BIN, "ansible-lint"), "--profile", "production", "--nocolor")
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("playbook", ["site.yml", "bench.yml"] + sorted(
    os.path.relpath(path, REPO) for path in glob.glob(os.path.join(REPO, "playbooks", "*.yml"))))
def test_playbook_syntax(playbook):
    inventory = "inventory/sandbox.yml" if "sandbox" in playbook else "inventory/glows.yml"
    result = run_tool(os.path.join(BIN, "ansible-playbook"), "-i", inventory, "--syntax-check", playbook)
    assert result.returncode == 0, result.stdout
