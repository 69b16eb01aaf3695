"""What the Hugging Face hub says a file is, before any byte of it is downloaded. Runs on the nodes: Python 3.8.

A HEAD of /<repo>/resolve/<revision>/<file>, not following the redirect to the CDN,
answers X-Repo-Commit (the commit the revision resolves to) and, for an LFS file,
X-Linked-Etag (its sha256, quoted) and X-Linked-Size. A file kept in git itself (no
LFS) answers only its git blob id as ETag: no sha256, so the caller falls back to
pinning the first download.
"""

import http.client
import re
import urllib.error
import urllib.request
from typing import Dict, Mapping, Optional
from urllib.parse import urljoin, urlsplit

SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
DIGITS = re.compile(r"^\d{1,19}$")


class HubError(Exception):
    """The hub's answer cannot be used; the message names the URL and what is wrong."""


def _unquote_etag(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"').lower()


def _size(url: str, name: str, value: Optional[str]) -> Optional[int]:
    if value is None:
        return None
    if not DIGITS.match(value.strip()):
        raise HubError("%s answered %s %r, which is not a size in bytes" % (url, name, value))
    return int(value.strip())


def parse_file_metadata(url: str, status: int, headers: Mapping[str, str]) -> Dict[str, object]:
    """{commit, sha256, size, lfs} from the headers of a resolve HEAD; None for what the hub did not say."""
    linked = _unquote_etag(headers.get("X-Linked-Etag"))
    commit = (headers.get("X-Repo-Commit") or "").strip().lower()
    if commit and not COMMIT.match(commit):
        raise HubError("%s answered X-Repo-Commit %r, which is not a git commit id" % (url, commit))
    if linked is not None and not SHA256.match(linked):
        raise HubError("%s answered X-Linked-Etag %r, which is not a sha256" % (url, linked))
    size = _size(url, "X-Linked-Size", headers.get("X-Linked-Size"))
    if size is None and linked is None and 200 <= status < 300:
        size = _size(url, "Content-Length", headers.get("Content-Length"))
    return {"commit": commit or None, "sha256": linked, "size": size, "lfs": linked is not None}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib's hook
        return None


def head(url: str, token: Optional[str] = None, timeout: float = 30.0) -> Dict[str, object]:
    """The hub's metadata of one file; a same-host redirect (a renamed repository) is followed once."""
    opener = urllib.request.build_opener(_NoRedirect)
    for _hop in range(3):
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "prima-cluster/1"})
        if token:
            request.add_unredirected_header("Authorization", "Bearer %s" % token)
        try:
            response = opener.open(request, timeout=timeout)
            status, headers = response.getcode(), response.headers
            response.close()
        except urllib.error.HTTPError as error:
            status, headers = error.code, error.headers
            if status in (401, 403):
                raise HubError("%s answered %d: the hub token (vault_hf_token) is missing or has no access to this "
                               "repository" % (url, status))
            if status == 404:
                raise HubError("%s answered 404 (%s): check hub_repo, revision and the file name in the model "
                               "catalog" % (url, headers.get("X-Error-Code") or "not found"))
            if status not in (301, 302, 303, 307, 308):
                raise HubError("%s answered %d %s" % (url, status, error.reason))
        except (OSError, urllib.error.URLError) as error:
            raise HubError("%s: the hub did not answer (%s); check models_hub_endpoint and the node's network"
                           % (url, getattr(error, "reason", error)))
        except (http.client.HTTPException, ValueError) as error:
            raise HubError("%s: not an answer of the hub (%s: %s); check models_hub_endpoint"
                           % (url, type(error).__name__, str(error)[:200]))
        location = headers.get("Location")
        if 300 <= status < 400 and location and not headers.get("X-Repo-Commit"):
            target = urljoin(url, location)
            if urlsplit(target).netloc != urlsplit(url).netloc or urlsplit(target).scheme != urlsplit(url).scheme:
                raise HubError("%s redirects to %s without saying what the file is" % (url, target))
            url = target
            continue
        return parse_file_metadata(url, status, headers)
    raise HubError("%s: too many redirects" % url)
