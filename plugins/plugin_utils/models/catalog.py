"""The model catalog: which weights a run needs, where they come from, and what they must hash to."""

import json
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


def model_selection_problems(model: Any, catalog: Mapping[str, Any], variable: str = "model") -> List[str]:
    """An unknown model key, naming the known ones."""
    keys = _as_keys(model)
    if not keys:
        return ["%s is empty; pass -e %s=KEY with KEY one of: %s" % (variable, variable, ", ".join(sorted(catalog)))]
    return ["%s '%s' is not in the model catalog (models_catalog in inventory/group_vars/all/models.yml); "
            "known keys: %s" % (variable, key, ", ".join(sorted(catalog)))
            for key in keys if key not in catalog]


def lock_key(entry: Mapping[str, Any], file_name: str) -> str:
    return "%s@%s/%s" % (entry["hub_repo"], entry.get("revision", "main"), file_name)


COMMIT = re.compile(r"^[0-9a-f]{40}$")


def lock_entry(lock: Optional[Mapping[str, Any]], key: str) -> Dict[str, Any]:
    """{sha256, commit, size} of a lock entry (lock_problems has checked it); an entry of 1.x is the bare digest."""
    value = (lock or {}).get(key)
    if isinstance(value, str):
        return {"sha256": value.strip().lower(), "commit": None, "size": None}
    if isinstance(value, Mapping):
        commit = value.get("commit")
        return {"sha256": str(value.get("sha256") or "").strip().lower() or None,
                "commit": commit.strip().lower() if isinstance(commit, str) and commit.strip() else None,
                "size": value.get("size")}
    return {}


def parse_lock(text: str) -> Any:
    """The lock file's JSON; the text itself when it is not JSON (lock_problems then names the file)."""
    try:
        return json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return text


def lock_problems(lock: Any, lock_file: str) -> List[str]:
    """Every lock entry that is not {sha256, commit, size} (or a bare sha256), named, with the fix.

    A broken entry is never read as no entry: that would let a moved repository in unnoticed.
    """
    if not isinstance(lock, Mapping):
        return ["%s is not a JSON object of '<repo>@<revision>/<file>': {sha256, commit, size}; restore it from "
                "version control, or remove it to pin every file afresh" % lock_file]
    problems = []  # type: List[str]
    for key, value in sorted(lock.items(), key=lambda item: str(item[0])):
        fix = "fix or remove that entry of %s (the next run pins the file afresh)" % lock_file
        if isinstance(value, str):
            if not SHA256.match(value.strip().lower()):
                problems.append("%s: %s is %s, not a sha256; %s" % (lock_file, shown(key), shown(value), fix))
            continue
        if not isinstance(value, Mapping):
            problems.append("%s: %s is %s, not {sha256, commit, size}; %s" % (lock_file, shown(key), shown(value),
                                                                              fix))
            continue
        digest, commit, size = value.get("sha256"), value.get("commit"), value.get("size")
        if not isinstance(digest, str) or not SHA256.match(digest.strip().lower()):
            problems.append("%s: %s has sha256 %s, not 64 hex digits; %s" % (lock_file, shown(key), shown(digest), fix))
        if commit is not None and not (isinstance(commit, str) and COMMIT.match(commit.strip().lower())):
            problems.append("%s: %s has commit %s, not a 40-digit hub commit id; %s"
                            % (lock_file, shown(key), shown(commit), fix))
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            problems.append("%s: %s has size %s, not a size in bytes; %s" % (lock_file, shown(key), shown(size), fix))
    return problems


def resolve_url(endpoint: str, repo: str, revision: str, name: str) -> str:
    return "%s/%s/resolve/%s/%s" % (endpoint.rstrip("/"), repo, revision, name)


def models_files(keys: Sequence[str], catalog: Mapping[str, Any], lock: Optional[Mapping[str, Any]],
                 endpoint: str) -> List[Dict[str, Any]]:
    """One record per file to fetch: url, size, and the digest it must have (catalog pin, else lock).

    A file the lock holds to a commit is fetched from that commit, not from the catalog's
    revision, so a repository that moves does not change what the cluster runs.
    """
    records = []  # type: List[Dict[str, Any]]
    for key in keys:
        entry = catalog[key]
        revision = entry.get("revision", "main")
        for spec in entry["files"]:
            name = spec["name"]
            pinned = spec.get("sha256") or ""
            locked = lock_entry(lock, lock_key(entry, name))
            commit = locked.get("commit")
            records.append({
                "model": key,
                "name": name,
                "url": resolve_url(endpoint, entry["hub_repo"], commit or revision, name),
                "revision_url": resolve_url(endpoint, entry["hub_repo"], revision, name),
                "revision": revision,
                "commit": commit,
                "size": int(spec.get("size") or 0),
                "expected_size": int(locked.get("size") or spec.get("size") or 0),
                "sha256": (pinned or locked.get("sha256") or "").lower(),
                "digest_source": "catalog" if pinned else ("lock" if locked.get("sha256") else "first download"),
                "lock_key": lock_key(entry, name),
            })
    return records


def hub_query(record: Mapping[str, Any]) -> Dict[str, Any]:
    """What to ask the hub about a file: its URL, and the revision's too when the lock holds it to a commit."""
    query = {"name": record["name"], "url": record["url"]}
    if record.get("commit") and record["digest_source"] == "lock":
        query["revision_url"] = record["revision_url"]
    return query


def with_hub_metadata(files: Sequence[Mapping[str, Any]], metadata: Mapping[str, Mapping[str, Any]],
                      endpoint: str, lock_file: str) -> Dict[str, Any]:
    """The records with what the hub says each file is: {files, problems, notices}.

    Where neither the catalog nor the lock gives a digest, the hub's X-Linked-Etag becomes
    the expected sha256 and the file is fetched from the commit the revision resolved to.
    A hub that disagrees with a pinned digest stops the run before any byte is fetched.
    """
    updated, problems, notices = [], [], []  # type: List[Dict[str, Any]], List[str], List[str]
    for record in files:
        record = dict(record)
        hub = metadata.get(record["name"])
        if not hub:
            updated.append(record)
            continue
        repo = record["lock_key"].split("@", 1)[0]
        where = "%s (%s at %s)" % (record["name"], repo, (hub.get("commit") or record["revision"])[:12])
        digest, size, commit = hub.get("sha256"), hub.get("size"), hub.get("commit")
        if record["commit"] and commit and commit != record["commit"]:
            problems.append("%s: asked for commit %s, the hub answered for commit %s; nothing was downloaded. Check "
                            "models_hub_endpoint (a mirror that ignores commits?)" % (where, record["commit"], commit))
        if size == 0:
            problems.append("%s: the hub says the file is empty (0 bytes); check the catalog's file name and the "
                            "repository" % where)
        if digest and record["sha256"] and digest != record["sha256"]:
            if record["digest_source"] == "catalog":
                fix = "correct its sha256 in the model catalog, or pin the catalog entry's revision to the commit you want"
            else:
                fix = "the hub changed the file under that commit, or the lock is wrong; remove %s from %s to take the " \
                      "hub's" % (record["lock_key"], lock_file)
            problems.append("%s: the hub says its sha256 is %s, the %s says %s; nothing was downloaded. %s"
                            % (where, digest, "catalog" if record["digest_source"] == "catalog" else "lock file",
                               record["sha256"], fix))
        if record["digest_source"] == "lock" and record["commit"] and hub.get("revision_commit") \
                and hub["revision_commit"] != record["commit"]:
            notices.append("NOTICE: %s@%s has moved to %s; %s holds %s to commit %s (sha256 %s). To take the new one, "
                           "remove %s from the lock file"
                           % (repo, record["revision"], hub["revision_commit"][:12], lock_file, record["name"],
                              record["commit"][:12], record["sha256"][:12], record["lock_key"]))
        if record["digest_source"] == "first download":
            if commit:
                record["commit"] = commit
                record["url"] = resolve_url(endpoint, repo, commit, record["name"])
            if digest:
                record["sha256"], record["digest_source"] = digest, "hub"
            else:
                notices.append("NOTICE: %s: the hub gives no LFS digest (X-Linked-Etag) for it, so its first verified "
                               "download is pinned in %s and later runs are held to that" % (where, lock_file))
        if size is not None:
            if record["size"] and size != record["size"]:
                notices.append("NOTICE: %s: the hub says %d bytes, the catalog %d (used for the disk check); correct "
                               "the catalog's size" % (where, size, record["size"]))
            if record["digest_source"] != "lock":
                record["expected_size"] = size
        updated.append(record)
    return {"files": updated, "problems": problems, "notices": notices}


# A model key names the launch scripts, state directories and systemd units (prima-bench-<runtime>-<key>.service);
# a file name is a file in cluster_models_dir and the last part of its hub URL; a revision is part of that URL.
MODEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
REVISION_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")


def shown(value: Any) -> str:
    """A value for a message: quoted, on one line (control characters escaped)."""
    return repr(value) if isinstance(value, str) else "'%s'" % (value,)


def model_key_problem(key: Any) -> Optional[str]:
    """Why a catalog key cannot name a model's scripts and units, or None."""
    if not isinstance(key, str):
        return ("the key %s is not a string; quote it in the YAML (models_catalog: {'%s': ...})" % (shown(key), key))
    if MODEL_KEY.fullmatch(key) and ".." not in key:
        return None
    return ("the key %s may only hold letters, digits, '.', '_' and '-', starting with a letter or digit (no '/', "
            "no '..', no spaces or control characters): it names the launch scripts and systemd units "
            "(prima-bench-<runtime>-<key>.service); rename the entry" % shown(key))


def file_name_problem(name: Any) -> Optional[str]:
    """Why a catalog file name cannot be a file in cluster_models_dir, or None."""
    if isinstance(name, str) and FILE_NAME.fullmatch(name) and ".." not in name:
        return None
    return ("name %s is not a plain file name: letters, digits, '.', '_', '+' and '-' only (no '/', no '..', no "
            "spaces or control characters), since it is the file's name in cluster_models_dir and the last part of "
            "its hub URL; give the name of the file as the hub lists it, without folders" % shown(name))


def revision_problem(revision: Any) -> Optional[str]:
    """Why a catalog revision cannot be a branch, tag or commit in a hub URL, or None."""
    if revision is None or (isinstance(revision, str) and not revision.strip()):
        return ("revision is empty; set it to a branch, tag or commit of the hub repository (like main), or leave "
                "revision out for main")
    if not isinstance(revision, str):
        return ("revision %s is not a string; set it to a branch, tag or commit of the hub repository, quoted "
                "(revision: '%s')" % (shown(revision), revision))
    if all(REVISION_PART.fullmatch(part) for part in revision.split("/")) and ".." not in revision:
        return None
    return ("revision %s is not a branch, tag or commit name (letters, digits, '.', '_', '+', '-', and '/' between "
            "parts; no '..', no spaces or control characters); set it to the branch, tag or commit of the hub "
            "repository, like main" % shown(revision))


def catalog_problems_detailed(catalog: Mapping[str, Any], extra: Optional[Mapping[str, Any]] = None,
                              host: Optional[str] = None) -> List[str]:
    """Every malformed catalog entry, named, with what to fix.

    `extra` is models_extra_catalog (its keys are named as its entries) and `host` the host the catalog was read
    from (cluster_catalog_host), both only for the messages.
    """
    problems = []  # type: List[str]
    extra_keys = set(extra or {})
    for key, entry in sorted(catalog.items(), key=lambda item: str(item[0])):
        where = "%s%s[%s]" % ("host %s: " % host if host else "",
                              "models_extra_catalog" if key in extra_keys else "models_catalog", shown(key))
        key_problem = model_key_problem(key)
        if key_problem:
            problems.append("%s: %s" % (where, key_problem))
        if not isinstance(entry, Mapping):
            problems.append("%s is not a mapping of hub_repo, revision, files, n_layer" % where)
            continue
        repo = entry.get("hub_repo")
        if not isinstance(repo, str) or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            problems.append("%s.hub_repo %s is not an 'owner/name' hub repository" % (where, shown(repo)))
        revision = revision_problem(entry.get("revision", "main"))
        if revision:
            problems.append("%s.%s" % (where, revision))
        layers = entry.get("n_layer")
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            problems.append("%s.n_layer %s must be the model's layer count (a whole number >= 1)"
                            % (where, shown(layers)))
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
        name_problem = file_name_problem(spec["name"])
        if name_problem:
            problems.append("%s %s" % (label, name_problem))
            continue
        names.append(spec["name"])
        size = spec.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append("%s (%s): size %s must be the file's size in bytes (the disk check uses it)"
                            % (label, spec["name"], shown(size)))
        digest = spec.get("sha256")
        if digest not in (None, "") and not (isinstance(digest, str) and SHA256.fullmatch(digest.lower())):
            problems.append("%s (%s): sha256 %s is not 64 hex digits; leave it empty to pin the first download "
                            "in the lock file" % (label, spec["name"], shown(digest)))
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


def lock_updates(lock: Optional[Mapping[str, Any]], files: Sequence[Mapping[str, Any]],
                 digests: Mapping[str, str]) -> Dict[str, Any]:
    """The lock with {sha256, commit, size} of every file that had no entry. Never rewrites an entry."""
    updated = dict(lock or {})
    for record in files:
        digest = digests.get(record["name"])
        if digest and record["lock_key"] not in updated and record["digest_source"] in ("hub", "first download"):
            updated[record["lock_key"]] = {"sha256": digest, "commit": record.get("commit"),
                                           "size": record.get("expected_size") or None}
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
