"""Every command in README.md's code blocks, as a person would type it, and what the suite does with each one.

Pure (standard library only, no I/O but reading the README when asked); tests/unit/test_readme_commands.py checks
the rules and that every command is classified, tests/integration/test_readme_run_as_typed.py runs the RUN ones
through `bash -c` exactly as written.

What counts as a command (the rules, in order):

1. Only code blocks hold commands. A code block is a fenced block (``` or ~~~) whose info string is empty, sh,
   bash or shell (any other info string, like yaml, json, text or console, holds none), or an indented block:
   after a blank line, lines indented by 4 or more columns beyond the content of the list item they are in
   (0 outside lists), up to the first non-blank line indented less.
2. In a block, a line at the block's own indentation starts an entry. A line indented further continues the
   entry before it (the bench synopsis wraps that way), and so does the line after one that ends with a
   backslash. The lines of an entry are joined with one space.
3. Comments go as bash drops them: from an unquoted # at the start of a word to the end of the line. A line
   that is only a comment belongs to the entry before it (Command.comments), as `# = ...` equivalents do.
4. An entry is a command when its first word, after any NAME=value environment assignments, names a program:
   a plain name (letters, digits, _, + and -, no dot, not starting with -), `.` (bash's source), or a path
   that ends in .sh or .py or lies in a bin/ directory. Anything else is not a command: file listings
   (`site.yml  preflight, ...`, `tools/ ...`), output a playbook prints (`1. The tunnel, ...`), YAML
   (`key: value`, `- item`), tables (`| ...`) and prose.
5. An optional part is written [...]: a word that starts with an unquoted [ up to the word that ends with the
   matching unquoted ], not nested. variants() gives the command with every optional part and the command
   with none, so each part is present in one variant and absent in the other. An unquoted | inside [...] is
   refused: bash would read it as a pipe. Write one value that runs and give the choices in prose or a comment.

A command is matched to CLASSIFICATION by its exact text (rule 2's joined text, comments removed, optional parts
still in brackets): RUN with the setup it needs, or EXCUSED with the reason. A README command that is in
neither, or a table entry that is no longer in the README, fails the unit test.
"""

import os
import re
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

FENCE = re.compile(r"^( *)(`{3,}|~{3,})(.*)$")
LIST_ITEM = re.compile(r"^( *)([-*+]|\d{1,9}[.)])( +|$)")
COMMAND_FENCES = ("", "sh", "bash", "shell")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
PROGRAM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+-]*|\."
                     r"|(?:\.{1,2}/|/)?(?:[A-Za-z0-9_.+-]+/)*(?:[A-Za-z0-9_+-]+\.(?:sh|py)|bin/[A-Za-z0-9_.+-]+)")


class Command(NamedTuple):
    text: str                  # as matched against CLASSIFICATION
    line: int                  # where it starts in README.md (1-based)
    comments: Tuple[str, ...]  # its comments, without the #, in order


class Verdict(NamedTuple):
    kind: str    # RUN or EXCUSED
    detail: str  # RUN: the setup it needs (SETUPS); EXCUSED: the reason


RUN, EXCUSED = "RUN", "EXCUSED"
NONE, FAKE_GLOWS, SANDBOX = "none", "fake Glows API", "sandbox provisioned"
SETUPS = (NONE, FAKE_GLOWS, SANDBOX)


# ---- rule 1: code blocks

def code_blocks(markdown: str) -> List[Tuple[int, List[str]]]:
    """(line number of the block's first line, its lines) for every code block that may hold commands."""
    lines = markdown.split("\n")
    blocks = []  # type: List[Tuple[int, List[str]]]
    base = 0  # content indentation of the list item the text is in
    blank_before = True
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = FENCE.match(line)
        if fence:
            marker, info = fence.group(2), fence.group(3).strip()
            end = index + 1
            while end < len(lines) and not re.match(r"^ *%s%s* *$" % (re.escape(marker), re.escape(marker[0])),
                                                    lines[end]):
                end += 1
            if (info.split() or [""])[0].lower() in COMMAND_FENCES:
                blocks.append((index + 2, lines[index + 1:end]))
            index, blank_before = end + 1, False
            continue
        if not line.strip():
            blank_before = True
            index += 1
            continue
        indent = _indent(line)
        if blank_before and indent >= base + 4:
            start = index
            while index < len(lines) and (not lines[index].strip() or _indent(lines[index]) >= base + 4):
                index += 1
            body = lines[start:index]
            while body and not body[-1].strip():
                body.pop()
            blocks.append((start + 1, body))
            blank_before = not lines[index - 1].strip()
            continue
        item = LIST_ITEM.match(line)
        if item:
            base = len(item.group(0)) if item.group(3) else len(item.group(0)) + 1
        elif indent < base:
            base = indent
        blank_before = False
        index += 1
    return blocks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


# ---- quoting: which characters bash reads as syntax

def _scan(text: str) -> Tuple[List[bool], bool]:
    """(for each character, True where bash reads it unquoted; whether the text ends inside an escape)."""
    mask = []  # type: List[bool]
    quote = None  # type: Optional[str]
    escaped = False
    for char in text:
        if escaped:
            mask.append(False)
            escaped = False
        elif quote == "'":
            mask.append(False)
            if char == "'":
                quote = None
        elif quote == '"':
            mask.append(False)
            if char == "\\":
                escaped = True
            elif char == '"':
                quote = None
        elif char == "\\":
            mask.append(False)
            escaped = True
        elif char in "'\"":
            mask.append(False)
            quote = char
        else:
            mask.append(True)
    return mask, escaped


def unquoted_mask(text: str) -> List[bool]:
    """For each character: True where bash reads it unquoted (quote characters and escapes count as quoted)."""
    return _scan(text)[0]


def words(text: str) -> List[Tuple[int, int]]:
    """(start, end) of every word: runs of characters between unquoted white space."""
    mask = unquoted_mask(text)
    spans = []  # type: List[Tuple[int, int]]
    start = None  # type: Optional[int]
    for position, char in enumerate(text):
        if mask[position] and char.isspace():
            if start is not None:
                spans.append((start, position))
                start = None
        elif start is None:
            start = position
    if start is not None:
        spans.append((start, len(text)))
    return spans


def split_comment(line: str) -> Tuple[str, Optional[str]]:
    """Rule 3: (the line without its comment, right-stripped; the comment without # and spaces, or None)."""
    mask = unquoted_mask(line)
    for position, char in enumerate(line):
        if char == "#" and mask[position] and (position == 0 or (line[position - 1].isspace() and mask[position - 1])):
            return line[:position].rstrip(), line[position + 1:].strip()
    return line.rstrip(), None


def _continues(line: str) -> bool:
    """The line ends with a backslash that escapes the newline (bash joins the next line to it)."""
    return _scan(line.rstrip())[1]


# ---- rules 2 to 4: entries and commands

def entries(block: List[str], first_line: int) -> List[Command]:
    """Every entry of a block (rule 2), commands or not, its comments apart (rule 3)."""
    indents = [_indent(line) for line in block if line.strip()]
    if not indents:
        return []
    own = min(indents)
    found = []  # type: List[Tuple[int, List[str], List[str]]]
    joined_next = False
    for offset, raw in enumerate(block):
        if not raw.strip():
            joined_next = False
            continue
        text, comment = split_comment(raw)
        starts = _indent(raw) <= own and not joined_next
        if starts and text.strip():
            found.append((first_line + offset, [], []))
        if found:
            if text.strip():
                found[-1][1].append(text.strip())
            if comment is not None:
                found[-1][2].append(comment)
        joined_next = _continues(text)
        if joined_next and found:
            found[-1][1][-1] = found[-1][1][-1][:-1].rstrip()
    return [Command(" ".join(part for part in parts if part), line, tuple(comments))
            for line, parts, comments in found if parts]


def is_command(text: str) -> bool:
    """Rule 4."""
    for start, end in words(text):
        word = text[start:end]
        if ASSIGNMENT.match(word):
            continue
        return bool(PROGRAM.fullmatch(word))
    return False


def extract(markdown: str) -> List[Command]:
    """Every command of the markdown's code blocks, in order."""
    commands = []  # type: List[Command]
    for first_line, block in code_blocks(markdown):
        commands += [entry for entry in entries(block, first_line) if is_command(entry.text)]
    return commands


def readme_commands(path: str = README) -> List[Command]:
    with open(path, encoding="utf-8") as handle:
        return extract(handle.read())


# ---- rule 5: optional parts

def optional_parts(text: str) -> List[Tuple[int, int]]:
    """(start, end) of every [...] part, brackets included; ValueError for one that cannot run as typed."""
    mask = unquoted_mask(text)
    parts = []  # type: List[Tuple[int, int]]
    opened = None  # type: Optional[int]
    for start, end in words(text):
        word_opens = mask[start] and text[start] == "["
        if word_opens:
            if opened is not None:
                raise ValueError("nested [ in %r: optional parts are not nested" % text)
            opened = start
        for position in range(start + (1 if word_opens else 0), end):
            if not mask[position] or text[position] not in "[]|":
                continue
            if opened is None and text[position] == "]" and position == end - 1:
                raise ValueError("] without [ in %r" % text)
            if opened is not None and text[position] == "|":
                raise ValueError("%r: | inside [...] is a pipe to bash; write one value that runs and give the "
                                 "choices in prose or a comment" % text[opened:end])
            if opened is not None and text[position] == "[":
                raise ValueError("nested [ in %r: optional parts are not nested" % text)
        if opened is not None and mask[end - 1] and text[end - 1] == "]":
            parts.append((opened, end))
            opened = None
    if opened is not None:
        raise ValueError("[ without ] in %r" % text)
    return parts


def variants(text: str) -> List[str]:
    """The command with every optional part, then with none (one variant when it has none)."""
    parts = optional_parts(text)
    if not parts:
        return [text]
    pieces, inner = [], []  # type: List[str], List[str]
    last = 0
    for start, end in parts:
        pieces.append(text[last:start].strip())
        inner.append(text[start + 1:end - 1].strip())
        last = end
    pieces.append(text[last:].strip())
    present = [pieces[0]]
    for index, part in enumerate(inner):
        present += [part, pieces[index + 1]]
    every = " ".join(piece for piece in present if piece)
    none = " ".join(piece for piece in pieces if piece)
    return [every, none]


# ---- the classification

SUITE = "the suite itself: make test runs every test, this one included"
DEMO = ("the demo itself (sandbox up, site.yml, bench.yml, serve.yml, left running); its steps are the commands "
        "of 'Sandbox, step by step', each run here")
DESTROYS = ("destroys the sandbox mid-suite: conftest.py's sandbox fixture brings it up (playbooks/sandbox.yml "
            "-e sandbox_state=up) once for the session and down at its end")
REAL_GLOWS = ("real Glows nodes (the inventory names rented instances); test_glows_rental_sandbox.py runs the "
              "same playbooks on the fake Glows API's sandbox nodes through ansible-runner")
REAL_HF_70B = ("model=70b on real Glows nodes: 40 GB of weights from the real Hugging Face hub; the sandbox's hub "
               "serves the tiny models only, and the same playbook on them is run here from 'Sandbox, step by step'")
PLACEHOLDER = "a placeholder to fill in (YOUR_INVENTORY, /path/to/...): there is nothing to run as written"
INTERACTIVE = ("interactive (asks for the vault password and opens an editor) and writes into the checkout; "
               "test_glows_keys.py makes a vault with ansible-vault encrypt")

CLASSIFICATION = {
    # The two commands
    "make demo": Verdict(EXCUSED, DEMO),
    "make test": Verdict(EXCUSED, SUITE),
    # The sandbox
    "PRIMA_CPP_MIRROR=/path/to/prima.cpp.git make test": Verdict(EXCUSED, SUITE + "; " + PLACEHOLDER),
    # Sandbox, step by step (in order; the integration test runs them in this order)
    "make sandbox-up": Verdict(EXCUSED, DESTROYS),
    ". .venv/bin/activate": Verdict(RUN, NONE),
    "make site-sandbox": Verdict(RUN, SANDBOX),
    "ansible-playbook -i inventory/sandbox-mapped.yml bench.yml -e model=tiny -e runtime=llama_rpc,single -e runs=1":
        Verdict(RUN, SANDBOX),
    "ansible-playbook -i localhost, report.yml": Verdict(RUN, SANDBOX),
    "ansible-playbook -i inventory/sandbox-mapped.yml serve.yml -e model=tiny -e runtime=llama_rpc":
        Verdict(RUN, SANDBOX),
    "ansible-playbook -i inventory/sandbox-mapped.yml serve.yml -e state=status": Verdict(RUN, SANDBOX),
    "ansible-playbook -i inventory/sandbox-mapped.yml serve.yml -e state=stopped": Verdict(RUN, SANDBOX),
    "make ready INVENTORY=inventory/sandbox-mapped.yml": Verdict(RUN, SANDBOX),
    "make sandbox-down": Verdict(EXCUSED, DESTROYS),
    # The benchmark, its server mode, serving: the synopses, for the Glows cluster and the 70B model
    "ansible-playbook bench.yml -e model=70b [-e runtime=prima] [-e runs=3] [-e links=1gbit,2.5gbit,10gbit]":
        Verdict(EXCUSED, REAL_HF_70B),
    "ansible-playbook bench.yml -e model=70b -e mode=server [-e clients=1,2,4] [-e runs=3]":
        Verdict(EXCUSED, REAL_HF_70B),
    "ansible-playbook serve.yml -e model=70b [-e runtime=prima] [-e state=started]": Verdict(EXCUSED, REAL_HF_70B),
    # Is every node ready?
    "make ready INVENTORY=inventory/glows.yml": Verdict(
        EXCUSED, "real Glows nodes (inventory/glows.yml); the same target on the sandbox is run here from "
                 "'Sandbox, step by step'"),
    # Rent, provision, benchmark, release
    "ansible-playbook playbooks/glows-rent.yml -e count=3 -e \"gpu='NVIDIA GeForce RTX 4090'\" [-e region=TW-03] "
    "[-e snapshot=ID]": Verdict(RUN, FAKE_GLOWS),
    "ansible-playbook -i inventory/glows.glows.yml playbooks/glows-keys.yml": Verdict(EXCUSED, REAL_GLOWS),
    "ansible-playbook -i inventory/glows.glows.yml site.yml": Verdict(EXCUSED, REAL_GLOWS),
    "ansible-playbook -i inventory/glows.glows.yml bench.yml -e model=70b": Verdict(EXCUSED, REAL_HF_70B),
    "ansible-playbook playbooks/glows-release.yml": Verdict(RUN, FAKE_GLOWS),
    # Instances that already exist
    "ansible-vault create inventory/group_vars/cluster/vault.yml": Verdict(EXCUSED, INTERACTIVE),
    "ansible-playbook playbooks/glows-keys.yml --ask-vault-pass": Verdict(
        EXCUSED, "interactive (asks for the vault password) and real Glows nodes (inventory/glows.yml); "
                 "test_glows_keys.py runs this playbook with --vault-password-file on a sandbox node"),
    "ansible-playbook site.yml": Verdict(EXCUSED, "real Glows nodes: the default inventory, inventory/glows.yml"),
    # As an installed collection
    "make collection": Verdict(RUN, NONE),
    "ansible-galaxy collection install artifacts/prima-cluster-1.9.0.tar.gz": Verdict(RUN, NONE),
    "ansible-playbook -i YOUR_INVENTORY prima.cluster.site": Verdict(
        EXCUSED, PLACEHOLDER + "; tests/lint/test_collection.py runs the installed collection's playbooks by "
                               "their full names"),
    "ansible-playbook -i YOUR_INVENTORY prima.cluster.bench -e model=70b": Verdict(
        EXCUSED, PLACEHOLDER + "; " + REAL_HF_70B),
}  # type: Dict[str, Verdict]


def classify(text: str) -> Optional[Verdict]:
    return CLASSIFICATION.get(text)


def unclassified(commands: List[Command]) -> List[Command]:
    return [command for command in commands if command.text not in CLASSIFICATION]


def stale(commands: List[Command]) -> List[str]:
    """Table entries that are no longer README commands."""
    present = {command.text for command in commands}
    return [text for text in CLASSIFICATION if text not in present]


def to_run(setup: str, commands: Optional[List[Command]] = None) -> Iterator[Tuple[Command, str]]:
    """(command, variant) for every RUN command that needs `setup`, in README order."""
    for command in readme_commands() if commands is None else commands:
        verdict = classify(command.text)
        if verdict is not None and verdict.kind == RUN and verdict.detail == setup:
            for variant in variants(command.text):
                yield command, variant
