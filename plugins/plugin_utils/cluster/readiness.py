"""Pure pieces of the readiness suite (tests/readiness): what a node should have, read from
what it reports. The cluster checks themselves are bench.yml's own (bench/checks.py, launch/plan.py,
the ring_probe module and its /proc/net/tcp parser), so the suite and the benchmark's preflight cannot disagree.
"""

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


def version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def version_at_least(found: str, minimum: str) -> bool:
    return bool(found.strip()) and version_tuple(found) >= version_tuple(minimum)


def compiler_command(recorded: str) -> str:
    """The compiler a build recorded ('ccache g++-9 9.3.0-22' -> 'g++-9')."""
    words = [word for word in recorded.split() if word != "ccache"]
    return words[0] if words else ""


def expected_weights(files: Sequence[Mapping[str, Any]], models_dir: str) -> List[Dict[str, Any]]:
    """Where each selected weights file must be, its size (lock file, else catalog) and digest."""
    return [{"name": record["name"], "path": "%s/%s" % (models_dir.rstrip("/"), record["name"]),
             "size": int(record.get("expected_size") or record.get("size") or 0), "sha256": record.get("sha256") or ""}
            for record in files]


def glance(results: Mapping[Tuple[str, str], Tuple[str, str]], nodes: Sequence[str]) -> str:
    """One line per check, one column per node: pass / FAIL / skip, then every failure's reason."""
    checks = []  # type: List[str]
    for check, _node in results:
        if check not in checks:
            checks.append(check)
    width = max([len(check) for check in checks] + [5])
    columns = [max(len(node), 4) for node in nodes]
    lines = ["%-*s  %s" % (width, "check", "  ".join("%-*s" % (column, node) for column, node in zip(columns, nodes)))]
    for check in checks:
        cells = [results.get((check, node), ("", ""))[0] or "-" for node in nodes]
        row = "  ".join("%-*s" % (column, cell) for column, cell in zip(columns, cells))
        lines.append("%-*s  %s" % (width, check, row))
    reasons = ["%s on %s: %s" % (check, node, reason) for (check, node), (outcome, reason) in results.items()
               if outcome == "FAIL" and reason]
    return "\n".join(lines + ([""] + reasons if reasons else []))


def first_line(text: Optional[str], limit: int = 300) -> str:
    """The reason to show for a failed check: the assertion's message, or why SSH failed."""
    unreachable = re.search(r"exit_status=255, command=b'.*?', _stdout=b'.*?', _stderr=b'(.*?)'\)", text or "")
    if unreachable:
        return "node unreachable: " + unreachable.group(1).replace("\\r\\n", " ").strip()[:limit]
    for line in (text or "").splitlines():
        if line.strip() and not line.startswith(("assert ", "  ")):
            return line.strip()[:limit]
    return (text or "").strip().splitlines()[0][:limit] if (text or "").strip() else ""
