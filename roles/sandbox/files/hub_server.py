"""The sandbox's stand-in for the Hugging Face hub: the same URLs, headers and API answers.

    hub_server.py serve --root DIR --bind ADDR --port N --log FILE
    hub_server.py publish --repo-dir DIR/<owner>/<name> --from STAGING [--ref main] [--no-lfs NAME]
                          [--claim NAME=SHA256]

Storage, one directory per repository: `commits/<commit>/<files>` (immutable snapshots,
with `.hub.json`: each file's sha256 and size, what the hub claims if it lies, which
files are not LFS) and `refs/<revision>` (the commit a branch points at). `publish`
makes a commit of a directory of files and moves the ref to it, which is how a test
makes a repository move.

What it answers, like huggingface.co:
- HEAD/GET /<repo>/resolve/<revision>/<file>: an LFS file is a 302 to /cdn/... with
  X-Repo-Commit, X-Linked-Etag ("<sha256>"), X-Linked-Size and ETag; a non-LFS file is
  served directly with X-Repo-Commit and its git blob id as ETag.
- GET /cdn/<repo>/<commit>/<file>: the bytes, with single Range requests, If-Range and
  a strong ETag (the sha256).
- GET /api/models/<repo>/revision/<revision> and /api/models/<repo>/tree/<revision>.
Every response is logged as a JSON line {time, client, path, range, status, bytes, size}.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20
SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RANGE = re.compile(r"^bytes=(\d{1,19})-(\d{0,19})$")
LFS_POINTER_SIZE = 134


def byte_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """(first, last) of a single `bytes=A-[B]` range; None without one. ValueError: answer 416."""
    if not header:
        return None
    match = RANGE.match(header.strip())
    if not match:
        raise ValueError("unsupported range")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else size - 1
    if first >= size or last < first:
        raise ValueError("unsatisfiable range")
    return first, min(last, size - 1)


def git_blob_id(path: str) -> str:
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def publish(repo_dir: str, source: str, ref: str = "main", no_lfs: Optional[List[str]] = None,
            claims: Optional[Dict[str, str]] = None) -> str:
    """Commit the files of `source` and point `ref` at the commit; returns the commit id."""
    files = {}  # type: Dict[str, Dict[str, Any]]
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if os.path.isfile(path) and not name.startswith("."):
            files[name] = {"sha256": sha256_file(path), "size": os.path.getsize(path)}
    meta = {"files": files, "no_lfs": sorted(no_lfs or []), "claims": dict(claims or {})}
    commit = hashlib.sha1(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    target = os.path.join(repo_dir, "commits", commit)
    if not os.path.isdir(target):
        staging = target + ".tmp"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        for name in files:
            shutil.copyfile(os.path.join(source, name), os.path.join(staging, name))
        with open(os.path.join(staging, ".hub.json"), "w") as handle:
            json.dump(meta, handle, sort_keys=True)
        os.rename(staging, target)
    os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
    temporary = os.path.join(repo_dir, "refs", ref + ".tmp")
    with open(temporary, "w") as handle:
        handle.write(commit + "\n")
    os.replace(temporary, os.path.join(repo_dir, "refs", ref))
    return commit


class Repository:
    """One repository under the hub's root, read from disk on every request (tests change it live)."""

    def __init__(self, root: str, owner: str, name: str):
        self.id = "%s/%s" % (owner, name)
        self.dir = os.path.join(root, owner, name)

    def commit_of(self, revision: str) -> Optional[str]:
        if re.fullmatch(r"[0-9a-f]{40}", revision) and os.path.isdir(os.path.join(self.dir, "commits", revision)):
            return revision
        try:
            with open(os.path.join(self.dir, "refs", revision)) as handle:
                return handle.read().strip()
        except OSError:
            return None

    def meta(self, commit: str) -> Dict[str, Any]:
        with open(os.path.join(self.dir, "commits", commit, ".hub.json")) as handle:
            return json.load(handle)

    def path(self, commit: str, name: str) -> str:
        return os.path.join(self.dir, "commits", commit, name)


def split_path(url_path: str) -> List[str]:
    parts = [unquote(part) for part in urlsplit(url_path).path.split("/") if part]
    if not all(SAFE_PART.match(part) for part in parts):
        raise ValueError("unsafe path")
    return parts


class Handler(BaseHTTPRequestHandler):
    server_version = "prima-sandbox-hub/1"
    protocol_version = "HTTP/1.1"
    timeout = 60

    def do_HEAD(self):
        self._route(send_body=False)

    def do_GET(self):
        self._route(send_body=True)

    def _route(self, send_body: bool) -> None:
        try:
            parts = split_path(self.path)
        except ValueError:
            return self._reply(400, b"bad path\n")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(Repository(self.server.root, parts[0], parts[1]), parts[3], "/".join(parts[4:]),
                                 send_body)
        if len(parts) >= 5 and parts[0] == "cdn":
            repo = Repository(self.server.root, parts[1], parts[2])
            return self._file(repo.path(parts[3], "/".join(parts[4:])), send_body, {})
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] in ("revision", "tree"):
            return self._api(Repository(self.server.root, parts[2], parts[3]), parts[4], parts[5])
        self._reply(404, b"not found\n")

    def _resolve(self, repo: Repository, revision: str, name: str, send_body: bool) -> None:
        commit = repo.commit_of(revision)
        if commit is None:
            return self._reply(404, b"revision not found\n", {"X-Error-Code": "RevisionNotFound"})
        meta = repo.meta(commit)
        entry = meta["files"].get(name)
        if entry is None:
            return self._reply(404, b"entry not found\n", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit}
        if name in meta["no_lfs"]:
            headers["ETag"] = '"%s"' % git_blob_id(repo.path(commit, name))
            return self._file(repo.path(commit, name), send_body, headers)
        claimed = meta["claims"].get(name, entry["sha256"])
        headers.update({"X-Linked-Etag": '"%s"' % claimed, "X-Linked-Size": str(entry["size"]),
                        "ETag": '"%s"' % claimed,
                        "Location": "http://%s/cdn/%s/%s/%s" % (self.headers.get("Host", ""), repo.id, commit, name)})
        self._reply(302, b"", headers)

    def _api(self, repo: Repository, kind: str, revision: str) -> None:
        commit = repo.commit_of(revision)
        if commit is None:
            return self._reply(404, b'{"error": "Revision Not Found"}', {"Content-Type": "application/json"})
        meta = repo.meta(commit)
        files = []
        for name, entry in sorted(meta["files"].items()):
            record = {"type": "file", "path": name, "size": entry["size"],
                      "oid": git_blob_id(repo.path(commit, name))}
            if name not in meta["no_lfs"]:
                record["lfs"] = {"oid": meta["claims"].get(name, entry["sha256"]), "size": entry["size"],
                                 "pointerSize": LFS_POINTER_SIZE}
            files.append(record)
        if kind == "tree":
            body = files  # type: Any
        else:
            body = {"id": repo.id, "sha": commit,
                    "siblings": [{"rfilename": record["path"], "size": record["size"],
                                  **({"lfs": {"sha256": record["lfs"]["oid"], "size": record["size"],
                                              "pointerSize": LFS_POINTER_SIZE}} if "lfs" in record else {})}
                                 for record in files]}
        self._reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, path: str, send_body: bool, headers: Dict[str, str]) -> None:
        if not os.path.isfile(path) or os.path.islink(path):
            return self._reply(404, b"not found\n")
        size = os.path.getsize(path)
        etag = headers.get("ETag") or '"%s"' % self.server.sha256_cached(path)
        wanted = None  # type: Optional[Tuple[int, int]]
        if_range = self.headers.get("If-Range")
        if if_range is None or if_range == etag:
            try:
                wanted = byte_range(self.headers.get("Range"), size)
            except ValueError:
                return self._reply(416, b"", {"Content-Range": "bytes */%d" % size})
        first, last = wanted if wanted else (0, size - 1)
        length = last - first + 1 if size else 0
        status = 206 if wanted else 200
        self.send_response(status)
        for key, value in dict(headers, ETag=etag).items():
            self.send_header(key, value)
        if wanted:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        sent = 0
        if send_body:
            try:
                with open(path, "rb") as handle:
                    handle.seek(first)
                    while sent < length:
                        chunk = handle.read(min(CHUNK, length - sent))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        self._log(status, sent, size)

    def _reply(self, status: int, body: bytes, headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._log(status, 0, 0)

    def _log(self, status: int, sent: int, size: int) -> None:
        record = {"time": round(time.time(), 3), "client": self.client_address[0], "method": self.command,
                  "path": self.path, "range": self.headers.get("Range"), "status": status, "bytes": sent,
                  "size": size}
        with self.server.log_lock:
            with open(self.server.log_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: str, bind: str, port: int, log_path: str):
        super().__init__((bind, port), Handler)
        self.root = os.path.abspath(root)
        self.log_path = log_path
        self.log_lock = threading.Lock()
        self._digests = {}  # type: Dict[Tuple[str, int, int], str]

    def sha256_cached(self, path: str) -> str:
        info = os.stat(path)
        key = (path, info.st_size, info.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = sha256_file(path)
        return self._digests[key]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("--root", required=True)
    serve.add_argument("--bind", required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--log", required=True)
    make = commands.add_parser("publish")
    make.add_argument("--repo-dir", required=True)
    make.add_argument("--from", dest="source", required=True)
    make.add_argument("--ref", default="main")
    make.add_argument("--no-lfs", action="append", default=[])
    make.add_argument("--claim", action="append", default=[], help="NAME=SHA256 the hub claims instead")
    args = parser.parse_args(argv)
    if args.command == "publish":
        claims = dict(claim.split("=", 1) for claim in args.claim)
        print(publish(args.repo_dir, args.source, args.ref, args.no_lfs, claims))
        return 0
    server = HubServer(args.root, args.bind, args.port, args.log)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
