"""The model catalog: which weights a run needs, where they come from, and what they must hash to."""

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

SHA256 = re.compile(r"^[0-9a-f]{64}$")
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
GIB = 1024 ** 3


def _as_keys(value: Any) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part) for part in value]


def merged_catalog(catalog: Mapping[str, Any], extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    result = dict(catalog or {})
    result.update(extra or {})
    return result


def models_selection(model: Any, enabled: Sequence[str], catalog: Mapping[str, Any]) -> List[str]:
    """The catalog keys a run fetches: -e model=KEY[,KEY] when given, else the enabled ones."""
    keys = _as_keys(model) or _as_keys(enabled)
    unknown = [key for key in keys if key not in catalog]
    if unknown:
        raise ValueError("unknown model key(s) %s; known keys: %s" % (", ".join(unknown), ", ".join(sorted(catalog))))
    return list(dict.fromkeys(keys))


def catalog_problems(model: Any, catalog: Mapping[str, Any], variable: str = "model") -> List[str]:
    """An unknown model key, naming the known ones."""
    keys = _as_keys(model)
    if not keys:
        return ["%s is empty; pass -e %s=KEY with KEY one of: %s" % (variable, variable, ", ".join(sorted(catalog)))]
    return ["%s '%s' is not in the model catalog (models_catalog in inventory/group_vars/all/models.yml); "
            "known keys: %s" % (variable, key, ", ".join(sorted(catalog)))
            for key in keys if key not in catalog]


def lock_key(entry: Mapping[str, Any], file_name: str) -> str:
    return "%s@%s/%s" % (entry["hub_repo"], entry.get("revision", "main"), file_name)


def models_files(keys: Sequence[str], catalog: Mapping[str, Any], lock: Optional[Mapping[str, str]],
                 endpoint: str) -> List[Dict[str, Any]]:
    """One record per file to fetch: url, size, and the digest it must have (catalog pin, else lock)."""
    lock = lock or {}
    records = []  # type: List[Dict[str, Any]]
    for key in keys:
        entry = catalog[key]
        for spec in entry["files"]:
            name = spec["name"]
            pinned = spec.get("sha256") or ""
            locked = lock.get(lock_key(entry, name), "")
            records.append({
                "model": key,
                "name": name,
                "url": "%s/%s/resolve/%s/%s" % (endpoint.rstrip("/"), entry["hub_repo"], entry.get("revision", "main"),
                                                name),
                "size": int(spec.get("size") or 0),
                "sha256": (pinned or locked).lower(),
                "digest_source": "catalog" if pinned else ("lock" if locked else "first download"),
                "lock_key": lock_key(entry, name),
            })
    return records


def catalog_problems_detailed(catalog: Mapping[str, Any]) -> List[str]:
    """Every malformed catalog entry, named, with what to fix."""
    problems = []  # type: List[str]
    for key, entry in sorted(catalog.items(), key=lambda item: str(item[0])):
        where = "models_catalog['%s']" % key
        if not isinstance(entry, Mapping):
            problems.append("%s is not a mapping of hub_repo, revision, files, n_layer" % where)
            continue
        repo = entry.get("hub_repo")
        if not isinstance(repo, str) or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            problems.append("%s.hub_repo '%s' is not an 'owner/name' hub repository" % (where, repo))
        if not isinstance(entry.get("revision", "main"), str) or not entry.get("revision", "main"):
            problems.append("%s.revision must be a branch, tag or commit of the hub repository" % where)
        layers = entry.get("n_layer")
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            problems.append("%s.n_layer '%s' must be the model's layer count (a whole number >= 1)" % (where, layers))
        files = entry.get("files")
        if not isinstance(files, list) or not files:
            problems.append("%s.files must list the GGUF file(s) as {name, size, sha256}" % where)
            continue
        problems += _file_problems(where, files)
    return problems


def _file_problems(where: str, files: List[Any]) -> List[str]:
    problems = []  # type: List[str]
    names = []  # type: List[str]
    for index, spec in enumerate(files):
        label = "%s.files[%d]" % (where, index)
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or not spec["name"].endswith(".gguf"):
            problems.append("%s needs a name ending in .gguf" % label)
            continue
        names.append(spec["name"])
        size = spec.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append("%s (%s): size '%s' must be the file's size in bytes (the disk check uses it)"
                            % (label, spec["name"], size))
        digest = spec.get("sha256")
        if digest not in (None, "") and not (isinstance(digest, str) and SHA256.match(digest.lower())):
            problems.append("%s (%s): sha256 '%s' is not 64 hex digits; leave it empty to pin the first download "
                            "in the lock file" % (label, spec["name"], digest))
    parts = [SPLIT_NAME.match(name) for name in names]
    if any(parts):
        if not all(parts):
            problems.append("%s.files mixes split parts (-0000k-of-0000N.gguf) with other files" % where)
        else:
            counts = {int(match.group("count")) for match in parts}
            found = sorted(int(match.group("part")) for match in parts)
            if len(counts) != 1 or found != list(range(1, counts.pop() + 1)):
                problems.append("%s.files must list every part 00001..N of the split GGUF, once each" % where)
    return problems


def lock_updates(lock: Optional[Mapping[str, str]], files: Sequence[Mapping[str, Any]],
                 digests: Mapping[str, str]) -> Dict[str, str]:
    """The lock with the first verified digest of every file that had none. Never rewrites an entry."""
    updated = dict(lock or {})
    for record in files:
        digest = digests.get(record["name"])
        if digest and record["lock_key"] not in updated and record["digest_source"] == "first download":
            updated[record["lock_key"]] = digest
    return updated


def digest_conflicts(digests_by_host: Mapping[str, Mapping[str, str]]) -> List[str]:
    """Files whose verified digest differs between nodes, naming the nodes."""
    seen = {}  # type: Dict[str, Dict[str, List[str]]]
    for host, digests in sorted(digests_by_host.items()):
        for name, digest in (digests or {}).items():
            seen.setdefault(name, {}).setdefault(digest, []).append(host)
    return ["%s differs between nodes: %s; the hub served different bytes to them, fetch it again"
            % (name, "; ".join("%s on %s" % (digest[:12], ", ".join(hosts)) for digest, hosts in sorted(by.items())))
            for name, by in sorted(seen.items()) if len(by) > 1]


def fact_entries(existing: Optional[Mapping[str, Any]], files: Sequence[Mapping[str, Any]],
                 digests: Mapping[str, str], models_dir: str) -> Dict[str, Any]:
    """The node's weights fact: every verified file by name, with its model, path and digest."""
    result = dict(existing or {})
    for record in files:
        digest = digests.get(record["name"])
        if digest:
            result[record["name"]] = {"model": record["model"], "sha256": digest,
                                      "path": "%s/%s" % (models_dir.rstrip("/"), record["name"])}
    return result


def disk_problem(host: str, path: str, available: int, files: Sequence[Mapping[str, Any]],
                 present: Mapping[str, int], margin_gib: float) -> Optional[str]:
    """None when the free space covers the missing bytes plus the margin, else the numbers."""
    needed = sum(max(int(record["size"]) - int(present.get(record["name"], 0)), 0) for record in files)
    margin = int(margin_gib * GIB)
    if needed == 0 or available >= needed + margin:
        return None
    return ("%s: %s has %.2f GiB free; the selected weights need %.2f GiB more plus a %.2f GiB margin "
            "(models_disk_margin_gib), %.2f GiB short. Free disk space, or fetch fewer models with -e model=KEY"
            % (host, path, available / GIB, needed / GIB, margin / GIB, (needed + margin - available) / GIB))
