"""Resumable, verified downloads of large files (model weights). Runs on the nodes: Python 3.8.

A file only ever appears under its final name after its sha256 was checked. Until then
it lives in `<dest>.partial`, which a later run resumes with an HTTP Range request. A
verified file gets a stamp `<dest>.verified` (size, mtime, ctime, inode, digest), so a
re-run does not hash 40 GB again while nothing has touched the file.
"""

import hashlib
import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, Optional

CHUNK = 4 << 20
PARTIAL_SUFFIX = ".partial"
STAMP_SUFFIX = ".verified"


class DownloadError(Exception):
    """A failure that retrying will not fix."""


def file_identity(path: str) -> Dict[str, int]:
    info = os.stat(path)
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns,
            "inode": info.st_ino}


def read_stamp(dest: str) -> Optional[Dict[str, object]]:
    try:
        with open(dest + STAMP_SUFFIX) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_stamp(dest: str, digest: str) -> None:
    stamp = dict(file_identity(dest), sha256=digest)
    temporary = dest + STAMP_SUFFIX + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(stamp, handle, sort_keys=True)
    os.replace(temporary, dest + STAMP_SUFFIX)


def stamp_still_valid(dest: str, expected: Optional[str]) -> Optional[str]:
    """The stamped digest when the file is unchanged since it was verified, else None."""
    stamp = read_stamp(dest)
    if not stamp or not os.path.exists(dest):
        return None
    identity = file_identity(dest)
    if any(stamp.get(key) != value for key, value in identity.items()):
        return None
    digest = str(stamp.get("sha256", ""))
    if expected and digest != expected:
        return None
    return digest


def sha256_of(path: str, on_bytes: Optional[Callable[[int], None]] = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))


class Progress:
    """Writes {state, bytes, total, rate_bytes_s, ...} to a JSON file every `interval` seconds."""

    def __init__(self, path: Optional[str], name: str, interval: float = 5.0, clock=time.monotonic):
        self.path, self.name, self.interval, self.clock = path, name, interval, clock
        self.started = clock()
        self.last_write = -interval
        self.bytes = 0
        self.total = None  # type: Optional[int]
        self.state = "starting"

    def update(self, state: str, bytes_done: int, total: Optional[int], force: bool = False) -> None:
        self.state, self.bytes, self.total = state, bytes_done, total
        now = self.clock()
        if self.path and (force or now - self.last_write >= self.interval):
            self.last_write = now
            elapsed = max(now - self.started, 1e-6)
            record = {"file": self.name, "state": state, "bytes": bytes_done, "total": total,
                      "percent": round(100.0 * bytes_done / total, 1) if total else None,
                      "elapsed_s": round(elapsed, 1), "rate_bytes_s": round(bytes_done / elapsed)}
            temporary = self.path + ".tmp"
            with open(temporary, "w") as handle:
                json.dump(record, handle)
            os.replace(temporary, self.path)


def _total_from_content_range(value: Optional[str]) -> Optional[int]:
    if value and "/" in value and not value.endswith("/*"):
        return int(value.rsplit("/", 1)[1])
    return None


def fetch_to_partial(url: str, partial: str, headers: Dict[str, str], timeout: float,
                     progress: Progress) -> Dict[str, object]:
    """One attempt: continue `partial` from its current size. Returns what was learned.

    Raises DownloadError for answers retrying cannot change, OSError/URLError for the rest.
    """
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    request = urllib.request.Request(url, headers=dict(headers))
    if offset:
        request.add_header("Range", "bytes=%d-" % offset)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            total = _total_from_content_range(error.headers.get("Content-Range"))
            if total == offset:
                return {"resumed_from": offset, "received": 0, "total": total}
            os.remove(partial)  # longer than the file the server has: start over
            raise OSError("partial file is longer than %s; starting over" % url)
        if error.code in (401, 403):
            raise DownloadError("%s answered %d %s: the hub token (vault) is missing or has no access to this "
                                "repository" % (url, error.code, error.reason))
        if error.code == 404:
            raise DownloadError("%s answered 404: check the repository, revision and file name in the "
                                "model catalog" % url)
        if 400 <= error.code < 500:
            raise DownloadError("%s answered %d %s" % (url, error.code, error.reason))
        raise
    with response:
        status = response.getcode()
        if offset and status == 200:
            offset = 0  # the server ignored the Range: take the whole body
        length = response.headers.get("Content-Length")
        total = _total_from_content_range(response.headers.get("Content-Range"))
        if total is None and length is not None:
            total = offset + int(length)
        received = 0
        with open(partial, "r+b" if offset else "wb") as handle:
            handle.seek(offset)
            handle.truncate()
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    break
                handle.write(chunk)
                received += len(chunk)
                progress.update("downloading", offset + received, total)
            handle.flush()
            os.fsync(handle.fileno())
        if total is not None and offset + received != total:
            raise OSError("connection closed after %d of %d bytes" % (offset + received, total))
        return {"resumed_from": offset, "received": received, "total": total}


def verify_only(dest: str, expected_sha256: Optional[str]) -> Dict[str, object]:
    """Whether `dest` is already a verified copy, changing nothing (check mode, planning)."""
    expected = expected_sha256.lower() if expected_sha256 else None
    stamped = stamp_still_valid(dest, expected)
    if stamped:
        return {"changed": False, "verified": True, "sha256": stamped, "verified_by": "stamp"}
    if os.path.exists(dest):
        digest = sha256_of(dest)
        if expected is None or digest == expected:
            return {"changed": False, "verified": True, "sha256": digest, "verified_by": "hash"}
    return {"changed": False, "verified": False, "sha256": None, "verified_by": None}


def download_verified(url: str, dest: str, expected_sha256: Optional[str] = None, token: Optional[str] = None,
                      retries: int = 5, timeout: float = 60.0, progress_path: Optional[str] = None,
                      retry_delay: float = 2.0) -> Dict[str, object]:
    """Make `dest` a verified copy of `url`; see the module docstring. Returns a summary."""
    expected = expected_sha256.lower() if expected_sha256 else None
    name = os.path.basename(dest)
    progress = Progress(progress_path, name)
    stamped = stamp_still_valid(dest, expected)
    if stamped:
        progress.update("done", os.path.getsize(dest), os.path.getsize(dest), force=True)
        return {"changed": False, "sha256": stamped, "size": os.path.getsize(dest), "verified_by": "stamp",
                "downloaded_bytes": 0, "resumed_from": None, "replaced_corrupt": False}
    replaced_corrupt = False
    if os.path.exists(dest):
        size = os.path.getsize(dest)
        digest = sha256_of(dest, lambda n: progress.update("hashing", progress.bytes + n, size))
        if expected is None or digest == expected:
            write_stamp(dest, digest)
            progress.update("done", size, size, force=True)
            return {"changed": True, "sha256": digest, "size": size, "verified_by": "hash",
                    "downloaded_bytes": 0, "resumed_from": None, "replaced_corrupt": False}
        os.remove(dest)
        replaced_corrupt = True
    if os.path.exists(dest + STAMP_SUFFIX):
        os.remove(dest + STAMP_SUFFIX)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    partial = dest + PARTIAL_SUFFIX
    headers = {"User-Agent": "prima-cluster/1"}
    if token:
        headers["Authorization"] = "Bearer %s" % token
    downloaded, first_offset = 0, None
    for attempt in range(retries + 1):
        try:
            result = fetch_to_partial(url, partial, headers, timeout, progress)
            downloaded += int(result["received"])
            if first_offset is None:
                first_offset = result["resumed_from"]
            break
        except DownloadError:
            raise
        except (OSError, urllib.error.URLError, socket.timeout) as error:
            if attempt == retries:
                raise DownloadError("%s: gave up after %d attempts; last error: %s. The partial file %s is kept "
                                    "and the next run resumes it" % (url, retries + 1, error, partial))
            time.sleep(retry_delay * (attempt + 1))
    size = os.path.getsize(partial)
    progress.update("verifying", 0, size, force=True)
    digest = sha256_of(partial, lambda n: progress.update("verifying", progress.bytes + n, size))
    if expected and digest != expected:
        os.remove(partial)
        raise DownloadError("%s: sha256 of the downloaded %s is %s, expected %s; the download was removed and "
                            "nothing was installed under %s" % (url, name, digest, expected, dest))
    os.replace(partial, dest)
    write_stamp(dest, digest)
    progress.update("done", size, size, force=True)
    return {"changed": True, "sha256": digest, "size": size, "verified_by": "download",
            "downloaded_bytes": downloaded, "resumed_from": first_offset, "replaced_corrupt": replaced_corrupt}
