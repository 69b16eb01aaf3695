"""`make help` names every target of the Makefile, and every target it names exists."""

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A rule's targets: `name other: prerequisites` at the start of a line (not `NAME := value` or `NAME ?= value`).
RULE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_ .-]*?)\s*::?(?![=])")


def makefile_targets(text):
    """Every target a person may type: each rule's names, without file targets ($(VENV)/.installed) and specials."""
    targets = set()
    for line in text.splitlines():
        if line.startswith(("\t", "#")) or re.match(r"^[A-Za-z0-9_]+\s*[:?+!]?=", line):
            continue
        match = RULE.match(line)
        if match:
            targets.update(name for name in match.group(1).split() if not name.startswith("."))
    return targets


def help_targets(output):
    """The targets `make help` names: the words after `make` on its lines, split at |."""
    named = set()
    for line in output.splitlines():
        if line.startswith("make "):
            names = re.split(r"\s{2,}", line[len("make "):].strip())[0]
            named.update(part.strip() for part in names.split("|") if part.strip())
    return named


def read_makefile():
    with open(os.path.join(REPO, "Makefile")) as handle:
        return handle.read()


def make_help():
    return subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout


def test_the_parsers_on_a_small_makefile():
    text = ("VAR ?= x\nSANDBOX := -i y\n.PHONY: a b\n# c: not a rule\na: venv\n\techo a: b\nb c: ; true\n"
            "$(VENV)/.installed: requirements.lock\n\ttouch $@\n")
    assert makefile_targets(text) == {"a", "b", "c"}
    assert help_targets("make a | b      what\n                 more words | here\nmake c\n") == {"a", "b", "c"}


def test_make_help_names_every_target():
    targets, named = makefile_targets(read_makefile()), help_targets(make_help())
    assert {"demo", "test", "help", "variables", "site-sandbox"} <= targets
    assert targets - named == set(), "make help does not name: %s" % ", ".join(sorted(targets - named))
    assert named - targets == set(), "make help names no such target: %s" % ", ".join(sorted(named - targets))


def test_every_target_is_phony():
    """None of them makes a file of its name: a file called `test` or `lint` must not make them a no-op."""
    phony = set()
    for line in read_makefile().splitlines():
        if line.startswith(".PHONY:"):
            phony.update(line.split(":", 1)[1].split())
    assert makefile_targets(read_makefile()) == phony
