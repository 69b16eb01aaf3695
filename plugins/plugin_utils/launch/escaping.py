"""Escaping for the launch role's templates (filters launch_c_escaped and launch_systemd_*): C escapes for a value
that must stay on one line, systemd's quoting and specifiers for a unit's settings (pure functions)."""

import re
import urllib.parse
from typing import Any

# What the templates put a value through where it must stay one line, or one word of a systemd command line.
# The preflight refuses model keys, file names and environment names that would need this; the templates stay
# safe when a value gets past it (playbooks/launch.yml alone, say).
UNSAFE_IN_A_LINE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029\\]")
C_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _c_escape(match: "re.Match[str]") -> str:
    char = match.group(0)
    return C_ESCAPES.get(char) or ("\\x%02x" % ord(char) if ord(char) < 0x100 else "\\u%04x" % ord(char))


def c_escaped(value: Any) -> str:
    """A value on one line (for a comment): backslashes and control characters C-escaped (\\n, \\x1b)."""
    return UNSAFE_IN_A_LINE.sub(_c_escape, str(value))


def systemd_text(value: Any) -> str:
    """A value of a unit setting that takes plain text (Description=, WorkingDirectory=): one line, and no
    specifiers (% doubled). A line can end in no backslash, so none continues onto the next."""
    return c_escaped(value).replace("%", "%%")


SYSTEMD_PLAIN_WORD = re.compile(r"[A-Za-z0-9/._+:,@=-]+")


def systemd_executable(value: Any) -> str:
    """The executable of a unit's command line (ExecStart=): as it is when plain, else double-quoted with C
    escapes, which systemd undoes, and no specifiers (%%): systemd splits unquoted words at whitespace. systemd
    expands no variables in the executable (an argument would need $$) and refuses one with quotes, backslashes
    or control characters: the unit then fails to load, and nothing else runs."""
    text = str(value)
    if SYSTEMD_PLAIN_WORD.fullmatch(text):
        return text
    return '"%s"' % c_escaped(text).replace('"', '\\"').replace("%", "%%")


def systemd_file_url(path: Any) -> str:
    """A file:// URL of a path for Documentation= (percent-encoded, and % doubled against specifiers)."""
    return "file://" + urllib.parse.quote(str(path), safe="/").replace("%", "%%")
