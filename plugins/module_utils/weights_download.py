"""Resumable, verified downloads of large files (model weights). Runs on the nodes: Python 3.8.

A file only ever appears under its final name after its size and sha256 were checked.
Until then it lives in `<dest>.partial`, which a later run resumes with an HTTP Range
request carrying If-Range (the ETag of the response the bytes came from, kept in
`<dest>.partial.json` with the URL, digest and size they belong to), so bytes of a file
that changed upstream are never spliced together. One downloader at a time holds an
flock on `<dest>.partial.lock`. A verified file gets a stamp `<dest>.verified` (size,
mtime, ctime, inode, digest), so a re-run does not hash 40 GB again while nothing has
touched the file.
"""

import fcntl
import hashlib
import http.client
import json
import os
import re
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Mapping, Optional, Tuple
from urllib.parse import urljoin, urlsplit

CHUNK = 4 << 20
PARTIAL_SUFFIX = ".partial"
STAMP_SUFFIX = ".verified"
META_SUFFIX = ".json"  # beside the partial file: <dest>.partial.json
LOCK_SUFFIX = ".partial.lock"


class DownloadError(Exception):
    """A failure that retrying will not fix."""


def file_identity(path: str) -> Dict[str, int]:
    info = os.stat(path)
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns,
            "inode": info.st_ino}


def read_json_object(path: str) -> Dict[str, Any]:
    """A small JSON object file of ours; {} for anything else (missing, garbage, another shape, a link)."""
    try:
        if os.path.islink(path) or os.path.getsize(path) > 65536:
            return {}
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def remove_entry(path: str) -> None:
    """Remove a file or a link (never what a link points to); a directory there is a DownloadError."""
    if os.path.isdir(path) and not os.path.islink(path):
        raise DownloadError("%s is a directory; remove it, the weights file goes there" % path)
    if os.path.lexists(path):
        os.remove(path)


def open_new(path: str, mode: str = "w"):
    """A new file at `path`, never through a link someone left there (O_EXCL | O_NOFOLLOW)."""
    remove_entry(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(descriptor, mode)


def write_json_atomically(path: str, value: Mapping[str, Any]) -> None:
    temporary = path + ".tmp"
    with open_new(temporary) as handle:
        json.dump(dict(value), handle, sort_keys=True)
    if os.path.isdir(path) and not os.path.islink(path):
        raise DownloadError("%s is a directory; remove it, the download keeps its record there" % path)
    os.replace(temporary, path)


def read_stamp(dest: str) -> Optional[Dict[str, object]]:
    return read_json_object(dest + STAMP_SUFFIX) or None


def write_stamp(dest: str, digest: str) -> None:
    write_json_atomically(dest + STAMP_SUFFIX, dict(file_identity(dest), sha256=digest))


def stamp_still_valid(dest: str, expected: Optional[str]) -> Optional[str]:
    """The stamped digest when the file is unchanged since it was verified, else None."""
    stamp = read_stamp(dest)
    if not stamp or not os.path.isfile(dest) or os.path.islink(dest):
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
            write_json_atomically(self.path, record)


class PartialLock:
    """An exclusive flock next to the `.partial`: one downloader per destination.

    A second downloader (a re-run while a killed controller's async download still runs)
    waits for the first and then finds its verified file; a holder that died releases the
    lock with its last file descriptor, and the next one takes over the partial file.
    """

    def __init__(self, dest: str, progress: "Progress", poll: float = 1.0):
        self.path, self.progress, self.poll = dest + LOCK_SUFFIX, progress, poll
        self.handle = None  # type: Optional[Any]

    def __enter__(self) -> "PartialLock":
        if os.path.islink(self.path):
            os.remove(self.path)  # never open, let alone write, what a link there points to
        descriptor = os.open(self.path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        self.handle = os.fdopen(descriptor)
        while True:
            try:
                fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                self.progress.update("waiting for another download of this file", self.progress.bytes,
                                     self.progress.total)
                time.sleep(self.poll)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.handle is not None:
            self.handle.close()


class HubRedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows redirects (the hub sends LFS files to a CDN host) without leaking the token.

    The token goes to the hub's own scheme and host only; a redirect from https to http is refused.
    """

    def __init__(self, origin: str, token: Optional[str]):
        super().__init__()
        self.origin, self.token = urlsplit(origin), token

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib's hook
        target = urlsplit(urljoin(req.full_url, newurl))
        if target.scheme not in ("http", "https"):
            raise DownloadError("%s redirects to %s: only http and https are followed" % (req.full_url, newurl))
        if urlsplit(req.full_url).scheme == "https" and target.scheme != "https":
            raise DownloadError("%s redirects to %s, from https down to %s: refused"
                                % (req.full_url, newurl, target.scheme))
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.token and (target.scheme, target.netloc) == (self.origin.scheme,
                                                                                 self.origin.netloc):
            new.add_unredirected_header("Authorization", "Bearer %s" % self.token)
        return new


def opener_for(url: str, token: Optional[str]) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(HubRedirectHandler(url, token))


CONTENT_RANGE = re.compile(r"^bytes (\d{1,19})-(\d{1,19})/(\d{1,19}|\*)$")
DIGITS = re.compile(r"^\d{1,19}$")


def parse_content_range(url: str, value: Optional[str]) -> Tuple[int, int, Optional[int]]:
    """(first, last, total) of a 206's Content-Range; DownloadError naming the URL when malformed."""
    match = CONTENT_RANGE.match((value or "").strip())
    if not match or int(match.group(2)) < int(match.group(1)):
        raise DownloadError("%s answered 206 with Content-Range %r, which is not 'bytes FIRST-LAST/TOTAL'"
                            % (url, value))
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


def parse_content_length(url: str, value: Optional[str]) -> Optional[int]:
    if value is None:
        return None
    if not DIGITS.match(value.strip()):
        raise DownloadError("%s answered Content-Length %r, which is not a size in bytes" % (url, value))
    return int(value.strip())


HEADER_VALUE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,254}$")


def strong_etag(value: Any) -> Optional[str]:
    """A strong ETag fit for If-Range; None for a weak, missing or malformed one."""
    if isinstance(value, str) and HEADER_VALUE.match(value) and value.startswith('"') and value.endswith('"'):
        return value
    return None


def read_partial_meta(partial: str) -> Dict[str, Any]:
    return read_json_object(partial + META_SUFFIX)


def write_partial_meta(partial: str, meta: Mapping[str, Any]) -> None:
    write_json_atomically(partial + META_SUFFIX, meta)


def discard(*paths: str) -> None:
    for path in paths:
        remove_entry(path)


def fetch_to_partial(url: str, partial: str, timeout: float, progress: Progress, token: Optional[str] = None,
                     expected_size: Optional[int] = None, meta: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """One attempt: continue `partial` from its current size. Returns what was learned.

    `meta` is what the partial file is a part of ({url, sha256, size}) and the validator
    (ETag) of the response it came from; it is kept beside the partial file for the next attempt.
    Raises DownloadError for answers retrying cannot change, OSError/URLError for the rest.
    """
    meta = dict(meta or {})
    validator = strong_etag(meta.get("validator"))
    if os.path.islink(partial) or (os.path.lexists(partial) and not validator):
        discard(partial)  # bytes no strong ETag vouches for are never resumed: splicing two versions is worse
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    if expected_size is not None and offset > expected_size:
        discard(partial)
        offset = 0
    if expected_size is not None and offset == expected_size and offset:
        return {"resumed_from": offset, "received": 0, "total": expected_size}
    request = urllib.request.Request(url, headers={"User-Agent": "prima-cluster/1"})
    if token:
        request.add_unredirected_header("Authorization", "Bearer %s" % token)
    if offset:
        # Bytes of a file that changed upstream are never spliced onto the old ones: with a
        # changed ETag the server answers 200 and the download starts over.
        request.add_header("Range", "bytes=%d-" % offset)
        request.add_header("If-Range", validator)
    try:
        response = opener_for(url, token).open(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            discard(partial)  # the server has no bytes past the partial file: start over
            raise OSError("%s has nothing past byte %d of the partial file; starting over" % (url, offset))
        if error.code in (401, 403):
            raise DownloadError("%s answered %d %s: the hub token (vault) is missing or has no access to this "
                                "repository" % (url, error.code, error.reason))
        if error.code == 404:
            raise DownloadError("%s answered 404: check the repository, revision and file name in the model "
                                "catalog" % url)
        if 400 <= error.code < 500:
            raise DownloadError("%s answered %d %s" % (url, error.code, error.reason))
        raise
    with response:
        status = response.getcode()
        length = parse_content_length(url, response.headers.get("Content-Length"))
        total = None  # type: Optional[int]
        if status == 206 and offset:
            if strong_etag(response.headers.get("ETag")) != validator:
                discard(partial)
                raise OSError("%s answered bytes of another version (ETag %s, the partial file has %s) to If-Range; "
                              "starting over" % (url, response.headers.get("ETag"), validator))
            first, last, total = parse_content_range(url, response.headers.get("Content-Range"))
            if first != offset:
                discard(partial)
                raise DownloadError("%s answered bytes from %d to a request for bytes from %d; the partial file was "
                                    "removed, the next run starts over" % (url, first, offset))
            if length is not None and length != last - first + 1:
                raise DownloadError("%s answered Content-Length %d for Content-Range %d-%d"
                                    % (url, length, first, last))
        elif status == 200:
            offset = 0  # the server ignored the Range, or the file changed (If-Range): take the whole body
            total = length
        else:
            raise DownloadError("%s answered %d to a download" % (url, status))
        if total is None and length is not None:
            total = offset + length
        if expected_size is not None and total is not None and total != expected_size:
            discard(partial)
            raise DownloadError("%s says the file has %d bytes, %d expected; nothing was installed"
                                % (url, total, expected_size))
        received = 0
        limit = expected_size if expected_size is not None else total
        if offset:
            handle = os.fdopen(os.open(partial, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)), "r+b")
        else:
            handle = open_new(partial, "wb")
        with handle:
            handle.seek(offset)
            handle.truncate()
            # Only now, with the old bytes cut off, may the new version's ETag vouch for the file.
            meta["validator"] = strong_etag(response.headers.get("ETag"))
            write_partial_meta(partial, meta)
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    break
                if limit is not None and offset + received + len(chunk) > limit:
                    handle.truncate(0)
                    discard(partial)
                    raise DownloadError("%s sent more than the %d bytes expected; the download was removed"
                                        % (url, limit))
                handle.write(chunk)
                received += len(chunk)
                progress.update("downloading", offset + received, total)
            handle.flush()
            os.fsync(handle.fileno())
        if limit is not None and offset + received != limit:
            raise OSError("connection closed after %d of %d bytes" % (offset + received, limit))
        return {"resumed_from": offset, "received": received, "total": total}


def verify_only(dest: str, expected_sha256: Optional[str]) -> Dict[str, object]:
    """Whether `dest` is already a verified copy, changing nothing (check mode, planning).

    Without an expected digest nothing is verified: the hub is asked first.
    """
    expected = expected_sha256.lower() if expected_sha256 else None
    if expected is None or os.path.islink(dest) or not os.path.isfile(dest):
        return {"changed": False, "verified": False, "sha256": None, "verified_by": None}
    stamped = stamp_still_valid(dest, expected)
    if stamped:
        return {"changed": False, "verified": True, "sha256": stamped, "verified_by": "stamp"}
    if sha256_of(dest) == expected:
        return {"changed": False, "verified": True, "sha256": expected, "verified_by": "hash"}
    return {"changed": False, "verified": False, "sha256": None, "verified_by": None}


def download_verified(url: str, dest: str, expected_sha256: Optional[str] = None, token: Optional[str] = None,
                      retries: int = 5, timeout: float = 60.0, progress_path: Optional[str] = None,
                      retry_delay: float = 2.0, expected_size: Optional[int] = None,
                      digest_source: str = "") -> Dict[str, object]:
    """Make `dest` a verified copy of `url`; see the module docstring. Returns a summary."""
    expected = expected_sha256.lower() if expected_sha256 else None
    expected_size = expected_size or None
    if urlsplit(url).scheme not in ("http", "https"):
        raise DownloadError("%s cannot be fetched: only http and https URLs are" % url)
    name = os.path.basename(dest)
    progress = Progress(progress_path, name)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with PartialLock(dest, progress):
        return _download_locked(url, dest, expected, expected_size, token, retries, timeout, progress, retry_delay,
                                digest_source)


def _download_locked(url: str, dest: str, expected: Optional[str], expected_size: Optional[int],
                     token: Optional[str], retries: int, timeout: float, progress: Progress, retry_delay: float,
                     digest_source: str) -> Dict[str, object]:
    name = os.path.basename(dest)
    stamped = stamp_still_valid(dest, expected)
    if stamped and (expected_size is None or os.path.getsize(dest) == expected_size):
        progress.update("done", os.path.getsize(dest), os.path.getsize(dest), force=True)
        return {"changed": False, "sha256": stamped, "size": os.path.getsize(dest), "verified_by": "stamp",
                "downloaded_bytes": 0, "resumed_from": None, "replaced_corrupt": False}
    replaced_corrupt = False
    if os.path.islink(dest) or os.path.isdir(dest):
        remove_entry(dest)  # a directory: a DownloadError naming it; a link: never followed
    elif os.path.exists(dest):
        size = os.path.getsize(dest)
        # Without a digest there is nothing to check a file found there against: fetch it.
        if expected is not None and (expected_size is None or size == expected_size):
            digest = sha256_of(dest, lambda n: progress.update("hashing", progress.bytes + n, size))
            if digest == expected:
                write_stamp(dest, digest)
                progress.update("done", size, size, force=True)
                return {"changed": True, "sha256": digest, "size": size, "verified_by": "hash",
                        "downloaded_bytes": 0, "resumed_from": None, "replaced_corrupt": False}
        os.remove(dest)
        replaced_corrupt = True
    discard(dest + STAMP_SUFFIX)
    partial = dest + PARTIAL_SUFFIX
    wanted = {"url": url, "sha256": expected, "size": expected_size}
    meta = read_partial_meta(partial)
    if os.path.lexists(partial) and {key: meta.get(key) for key in wanted} != wanted:
        discard(partial)  # a partial file of other bytes (another commit, another digest): never resumed
        meta = {}
    write_partial_meta(partial, dict(wanted, validator=meta.get("validator")))
    downloaded, first_offset = 0, None
    for attempt in range(retries + 1):
        try:
            result = fetch_to_partial(url, partial, timeout, progress, token, expected_size,
                                      dict(wanted, validator=read_partial_meta(partial).get("validator")))
            downloaded += int(result["received"])
            if first_offset is None:
                first_offset = result["resumed_from"]
            break
        except DownloadError:
            raise
        except (http.client.InvalidURL, ValueError) as error:
            raise DownloadError("%s cannot be fetched: %s" % (url, error))
        except (OSError, urllib.error.URLError, socket.timeout, http.client.HTTPException) as error:
            if attempt == retries:
                kept = (" The partial file %s is kept and the next run resumes it." % partial
                        if os.path.exists(partial) else "")
                raise DownloadError("%s: gave up after %d attempts; last error: %s.%s" % (url, retries + 1, error, kept))
            time.sleep(retry_delay * (attempt + 1))
    size = os.path.getsize(partial)
    if expected_size is not None and size != expected_size:
        discard(partial, partial + META_SUFFIX)
        raise DownloadError("%s: the download of %s has %d bytes, %d expected; it was removed and nothing was "
                            "installed under %s" % (url, name, size, expected_size, dest))
    progress.update("verifying", 0, size, force=True)
    digest = sha256_of(partial, lambda n: progress.update("verifying", progress.bytes + n, size))
    if expected and digest != expected:
        discard(partial, partial + META_SUFFIX)
        source = " (from the %s)" % digest_source if digest_source else ""
        raise DownloadError("%s: sha256 of the downloaded %s is %s, expected %s%s; the download was removed and "
                            "nothing was installed under %s" % (url, name, digest, expected, source, dest))
    os.replace(partial, dest)
    discard(partial + META_SUFFIX)
    write_stamp(dest, digest)
    progress.update("done", size, size, force=True)
    return {"changed": True, "sha256": digest, "size": size, "verified_by": "download",
            "downloaded_bytes": downloaded, "resumed_from": first_offset, "replaced_corrupt": replaced_corrupt}
