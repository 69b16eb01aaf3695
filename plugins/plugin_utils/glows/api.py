"""A small client of the Glows SDK HTTP API (v1), on the controller, with the standard library only.

Every failure is a GlowsError whose text is one line naming the endpoint (or the instance) and the fix. The
token goes in the Authorization header and nowhere else: never into a URL, a message or a repr, and never
to another host (a redirect off the API's own scheme, host and port is refused).
"""

# GUESSES: what the stored Glows docs (https://sdkdoc.glows.ai, "GLOWS SDK HTTP API (v1)") do not say.
# Everything below was chosen without a documented answer; check it first when the real API disagrees.
#   - List: GET /instance/list?page=P&per_page=N, pages from 1, answer {code, msg, instances: [...], total: T}.
#     The docs name a list call but not its path, parameters or keys (seen only in third-party code).
#   - Count: GET /instance/count, answer {code, msg, count: T}. Not documented anywhere.
#   - Cancel: DELETE /instance?request_id=ID | ?meta_key=KEY, answer {code, msg}. The parameters are documented,
#     the method is not.
#   - Error codes: the docs list the numbers of ErrCode but no meanings. 176 = bad or expired token (third-party
#     code saw it, on HTTP 200; it is not even in the documented enum); 10 = instance not found; 17 = the
#     custom_meta_key is already used (by this account or any other: the key is unique across Glows).
#   - priceCent: an integer; its unit is taken to be US cents per hour (65 = $0.65/h).
#   - hardware.gpuRamMB is taken to be per GPU, so a node's VRAM is gpuRamMB * gpuNum (inventory.py).
#   - baseSnap's inner keys are taken to be {snapID, snapName}.
#   - Statuses: only SchedQueued (pending) and Running (ready) are documented; a cancelled instance is taken to
#     disappear from list and query.

import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

DEFAULT_API_URL = "https://a.glows.ai/sdk/v1"

INSTANCE_PATH = "/instance"
LIST_PATH = "/instance/list"      # GUESS
LIST_KEY = "instances"            # GUESS
TOTAL_KEY = "total"               # GUESS
FIRST_PAGE = 1                    # GUESS
COUNT_PATH = "/instance/count"    # GUESS
COUNT_KEY = "count"               # GUESS
CANCEL_METHOD = "DELETE"          # GUESS
CODE_BAD_TOKEN = 176              # GUESS
CODE_NOT_FOUND = 10               # GUESS
CODE_META_KEY_TAKEN = 17          # GUESS
PRICE_UNIT = "US cents per hour"  # GUESS

# An instance listing is a few kB per instance; anything near this is not the API talking.
MAX_BODY_BYTES = 20 * 1024 * 1024
# An answer is read this much at a time, so the deadline is checked between pieces however slowly they come.
READ_CHUNK_BYTES = 64 * 1024
# A server's Retry-After is honoured, up to this, so a bad header cannot park a run for hours.
MAX_RETRY_AFTER_S = 60.0
# An SDK answer nests a few levels; far deeper is not the API, and would make any walk of it recurse too deep.
MAX_JSON_DEPTH = 64
# 500 000 instances at 50 a page: far beyond any account; past it the paging is broken, not long.
MAX_PAGES = 10000
TOKEN_FIX = "set GLOWS_SDK_TOKEN or the inventory's token to a valid SDK token"
URL_FIX = "check api_url / GLOWS_API_URL"


class GlowsError(Exception):
    """One line: what failed, where, and the fix. `code` is the API's code when it gave one, `status` the HTTP
    status when there was one, so callers can tell "not found" from the rest without parsing the text."""

    def __init__(self, message: str, code: Optional[int] = None, status: Optional[int] = None) -> None:
        super().__init__(" ".join(str(message).split()))
        self.code = code
        self.status = status


def _one_line(text: Any, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _origin(url: str) -> Tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would follow a redirect anywhere with the Authorization header still on: refuse any that leaves
    the API's scheme, host and port, so the token only ever goes where api_url points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib's signature
        target = urllib.parse.urljoin(req.full_url, newurl)
        if _origin(target) != _origin(req.full_url):
            raise GlowsError("the Glows API at %s redirected to another host (%s); refused so the token is not sent "
                             "there: %s" % (_endpoint_text(req.full_url), _endpoint_text(target), URL_FIX),
                             status=code)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _endpoint_text(url: str) -> str:
    """A URL for a message: no user info, no fragment (the token is never in a URL, but a user's api_url might
    carry credentials of its own)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = "%s:%d" % (netloc, parts.port)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


class GlowsClient:
    """The SDK calls used here: query, find, list_all, count, create, cancel. `sleep` is injectable so tests of the
    backoff do not wait."""

    def __init__(self, api_url: str, token: str, retries: int = 5, backoff_s: float = 1.0, timeout_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        api_url = str(api_url or "").strip().rstrip("/")
        if urllib.parse.urlsplit(api_url).scheme not in ("http", "https") or not urllib.parse.urlsplit(api_url).hostname:
            raise GlowsError("the Glows API URL %r is not an http(s) URL: %s (default %s)"
                             % (_one_line(api_url), URL_FIX, DEFAULT_API_URL))
        if not token or not str(token).strip():
            raise GlowsError("no Glows SDK token: %s" % TOKEN_FIX)
        token = str(token).strip()
        if not all(33 <= ord(char) < 127 for char in token):
            # A header cannot carry it, and urllib's complaint would quote it.
            raise GlowsError("the Glows SDK token has spaces or characters outside printable ASCII: %s" % TOKEN_FIX)
        self.api_url = api_url
        self._token = token
        self.retries = max(int(retries), 0)
        self.backoff_s = max(float(backoff_s), 0.0)
        # The most one request may take in all (connecting, sending, reading the whole answer), not each read.
        self.timeout_s = float(timeout_s)
        self._sleep = sleep
        self._opener = urllib.request.build_opener(_SameOriginRedirects())

    def __repr__(self) -> str:
        return "GlowsClient(api_url=%r)" % self.api_url

    # The calls.

    def query(self, request_id: str = "", meta_key: str = "") -> Dict[str, Any]:
        """The instance by its instanceID or its metaKey; GlowsError when the API has none."""
        params = self._selector(request_id, meta_key)
        answer = self._call("GET", INSTANCE_PATH, params)
        instance = answer.get("instance")
        if not isinstance(instance, dict) or not instance:
            raise GlowsError("%s answered no instance object: the API is not what this client expects; %s"
                             % (self._where("GET", INSTANCE_PATH, params), URL_FIX))
        return instance

    def find(self, meta_key: str) -> Optional[Dict[str, Any]]:
        """The instance with this metaKey, or None when the API says there is none."""
        params = self._selector("", meta_key)
        try:
            answer = self._call("GET", INSTANCE_PATH, params)
        except GlowsError as error:
            if error.code == CODE_NOT_FOUND:
                return None
            raise
        instance = answer.get("instance")
        if instance is None or instance == {}:
            return None
        if not isinstance(instance, dict):
            raise GlowsError("%s answered an instance that is not an object: %s"
                             % (self._where("GET", INSTANCE_PATH, params), URL_FIX))
        return instance

    def list_all(self, per_page: int = 50) -> List[Dict[str, Any]]:
        """Every instance of the account, all pages. A failed page, a page of the wrong shape or fewer instances
        than the announced total raise: a partial list would make an inventory drop nodes, or a release miss one."""
        per_page = max(int(per_page), 1)
        seen = {}  # type: Dict[str, Dict[str, Any]]
        total = None  # type: Optional[int]
        page = FIRST_PAGE
        while True:
            params = {"page": str(page), "per_page": str(per_page)}
            answer = self._call("GET", LIST_PATH, params)
            items = answer.get(LIST_KEY)
            if items is None:
                items = []
            if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
                raise GlowsError("%s answered %r that is not a list of instances: %s"
                                 % (self._where("GET", LIST_PATH, params), LIST_KEY, URL_FIX))
            announced = answer.get(TOTAL_KEY)
            if announced is not None:
                if isinstance(announced, bool) or not isinstance(announced, int) or announced < 0:
                    raise GlowsError("%s answered a %r that is not a count: %s"
                                     % (self._where("GET", LIST_PATH, params), TOTAL_KEY, self._short(announced, 40)))
                total = announced
            before = len(seen)
            for item in items:
                # Keyed by id: an instance created while the pages are read may shift another onto the next page.
                seen.setdefault(str(item.get("instanceID", "")) or "#%d" % len(seen), item)
            if not items or len(items) < per_page or (total is not None and len(seen) >= total):
                break
            if len(seen) == before or page - FIRST_PAGE >= MAX_PAGES:
                raise self._fail("%s answered a full page with no new instance (or more than %d pages): the listing "
                                 "does not end; re-run later" % (self._where("GET", LIST_PATH, params), MAX_PAGES))
            page += 1
        if total is not None and len(seen) != total:
            raise GlowsError("the Glows instance listing at %s gave %d instances but announced %d (it changed while "
                             "it was read, or a page came back short): re-run"
                             % (_endpoint_text(self.api_url + LIST_PATH), len(seen), total))
        return list(seen.values())

    def count(self) -> int:
        answer = self._call("GET", COUNT_PATH, {})
        value = answer.get(COUNT_KEY)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GlowsError("%s answered a %r that is not a count (%s): %s"
                             % (self._where("GET", COUNT_PATH, {}), COUNT_KEY, self._short(value, 40), URL_FIX))
        return value

    def create(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """Create an instance (the body as the docs give it: from_image_id or from_snap_id, gpu_name,
        custom_meta_key, instance_category, region_name, ...); the instance as the API answers it."""
        answer = self._call("POST", INSTANCE_PATH, {}, body=body)
        instance = answer.get("instance")
        if not isinstance(instance, dict) or not instance:
            raise GlowsError("%s answered no instance object for custom_meta_key %s: check the Glows console before "
                             "re-running (it may have been created)"
                             % (self._where("POST", INSTANCE_PATH, {}), _one_line(body.get("custom_meta_key", ""))))
        return instance

    def cancel(self, request_id: str = "", meta_key: str = "") -> None:
        """Release an instance. A missing one raises GlowsError with code CODE_NOT_FOUND."""
        self._call(CANCEL_METHOD, INSTANCE_PATH, self._selector(request_id, meta_key))

    # The plumbing.

    @staticmethod
    def _selector(request_id: str, meta_key: str) -> Dict[str, str]:
        # The docs take one or the other; what both at once would do is not documented.
        if bool(request_id) == bool(meta_key):
            raise GlowsError("a Glows instance call needs exactly one of request_id and meta_key (got %s)"
                             % ("both" if request_id else "neither"))
        return {"request_id": str(request_id)} if request_id else {"meta_key": str(meta_key)}

    def _url(self, path: str, params: Dict[str, str]) -> str:
        url = self.api_url + path
        return url + ("?" + urllib.parse.urlencode(params) if params else "")

    def _where(self, method: str, path: str, params: Dict[str, str]) -> str:
        return "%s %s" % (method, _endpoint_text(self._url(path, params)))

    def _scrub(self, text: str) -> str:
        # A server might echo the Authorization header back in a message, as it is or URL-encoded (in a query
        # string, a key=value); it never reaches ours. Anywhere, with no word boundary: a token glued to '.' or '='
        # is still the token. Longest form first, so a shorter one never leaves part of a longer one behind.
        forms = {self._token, urllib.parse.quote(self._token), urllib.parse.quote(self._token, safe=""),
                 urllib.parse.quote_plus(self._token)}
        pattern = "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))
        return re.sub(pattern, "<token>", str(text))

    def _short(self, text: Any, limit: int = 200) -> str:
        """Text from the server (or about its answer) for a message: scrubbed before it is shortened, since a cut
        could leave part of the token that the scrub would no longer recognise."""
        return _one_line(self._scrub(str(text)), limit)

    def _fail(self, message: str, code: Optional[int] = None, status: Optional[int] = None) -> GlowsError:
        return GlowsError(self._scrub(message), code=code, status=status)

    def _call(self, method: str, path: str, params: Dict[str, str], body: Optional[Dict[str, Any]] = None
              ) -> Dict[str, Any]:
        """One API call: retried on HTTP 429 with exponential backoff, then the envelope checked (code 0)."""
        url = self._url(path, params)
        where = self._where(method, path, params)
        data = json.dumps(body).encode("utf-8") if body is not None else None
        slept = 0.0
        tries = 0
        while True:
            tries += 1
            status, raw, retry_after = self._send(method, url, where, data)
            if status != 429:
                break
            if tries > self.retries:
                raise self._fail("rate limited by %s after %d tries over %.1f s; wait and re-run"
                                 % (where, tries, slept), status=429)
            delay = self.backoff_s * (2 ** (tries - 1))
            if retry_after is not None:
                delay = max(delay, min(retry_after, MAX_RETRY_AFTER_S))
            self._sleep(delay)
            slept += delay
        if status in (401, 403):
            raise self._fail("the Glows API refused the token (HTTP %d at %s): %s" % (status, where, TOKEN_FIX),
                             status=status)
        answer = self._decode(raw, status, where)
        code = answer["code"]
        message = self._short(answer.get("msg", ""))
        if code == CODE_BAD_TOKEN:
            raise self._fail("the Glows API refused the token (code 176 at %s: %s): %s" % (where, message, TOKEN_FIX),
                             code=code, status=status)
        if code == CODE_NOT_FOUND:
            raise self._fail("no such Glows instance: %s answered code %d (%s); check the instance id or metaKey "
                             "(a released instance is gone)" % (where, code, message), code=code, status=status)
        if code != 0:
            raise self._fail("%s answered code %d (%s); fix the request or re-run later (the codes are not "
                             "documented; see the GUESSES in plugins/plugin_utils/glows/api.py)"
                             % (where, code, message), code=code, status=status)
        if status != 200:
            raise self._fail("%s answered HTTP %d; re-run later or %s" % (where, status, URL_FIX), status=status)
        return answer

    def _send(self, method: str, url: str, where: str, data: Optional[bytes]
              ) -> Tuple[int, bytes, Optional[float]]:
        """HTTP status, body (capped) and Retry-After seconds. HTTP errors are answers too: the API sends its
        envelope with them, and 429 is retried by the caller. The body is read against one deadline, timeout_s
        from the start: urllib's timeout bounds each socket operation only, so a body trickled a byte at a time
        would never end. (The status line and headers are read inside urllib, each read within timeout_s; http.client
        caps them at 100 lines.)"""
        deadline = time.monotonic() + self.timeout_s
        headers = {"Authorization": "Bearer " + self._token, "Accept": "application/json",
                   "User-Agent": "prima.cluster-glows/1"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            try:
                response = self._opener.open(request, timeout=self.timeout_s)
                status, retry_after = response.status, None  # type: int, Optional[float]
            except urllib.error.HTTPError as error:
                # Read outside this except clause: a timeout or reset while reading the error's body must reach
                # the clauses below, which a raise inside a sibling clause would skip.
                response, status, retry_after = error, error.code, _retry_after(error.headers)
            with response:
                return status, self._read(response, where, deadline), retry_after
        except GlowsError:
            raise
        except http.client.HTTPException as error:
            # Not an OSError, so urllib lets it through: a status line, header or chunk that is not HTTP.
            raise self._fail("%s answered something that is not HTTP (%s: %s); %s"
                             % (where, type(error).__name__, self._short(error, 80), URL_FIX)) from None
        except urllib.error.URLError as error:
            raise self._fail("cannot reach the Glows API at %s: %s; %s"
                             % (_endpoint_text(self.api_url), self._short(error.reason), URL_FIX)) from None
        except (socket.timeout, TimeoutError):
            # A read waited out what was left of timeout_s (a connect that does is a URLError above).
            raise self._too_slow(where) from None
        except (OSError, ValueError) as error:
            # A connection reset, a broken TLS session or a malformed status line: the API did not answer.
            raise self._fail("cannot reach the Glows API at %s: %s (%s); %s"
                             % (_endpoint_text(self.api_url), type(error).__name__, self._short(error), URL_FIX)
                             ) from None

    def _read(self, response: Any, where: str, deadline: float) -> bytes:
        """The body, read piece by piece until the deadline: read1 returns what one socket read gives (read would
        wait for the whole size), so the deadline is checked at least every timeout_s."""
        read = getattr(response, "read1", None) or response.read
        pieces = []  # type: List[bytes]
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._too_slow(where)
            _limit_socket_wait(response, left)
            piece = read(min(READ_CHUNK_BYTES, MAX_BODY_BYTES + 1 - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
            if size > MAX_BODY_BYTES:
                raise self._fail("%s answered more than %d MiB; refused (not an SDK answer): %s"
                                 % (where, MAX_BODY_BYTES // (1024 * 1024), URL_FIX))
        if time.monotonic() > deadline:
            raise self._too_slow(where)
        return b"".join(pieces)

    def _too_slow(self, where: str) -> GlowsError:
        return self._fail("%s gave no complete answer within %g s (timeout_s, for connecting and reading it all); "
                          "re-run later, raise timeout_s, or %s" % (where, self.timeout_s, URL_FIX))

    def _excerpt(self, raw: bytes) -> str:
        # Scrubbed whole, then cut: an excerpt cut first could end in part of the token.
        return _one_line(self._scrub(raw.decode("utf-8", "replace"))[:80], 80)

    def _decode(self, raw: bytes, status: int, where: str) -> Dict[str, Any]:
        try:
            answer = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise self._fail("%s answered HTTP %d with JSON nested deeper than Python can read: not an SDK answer; %s"
                             % (where, status, URL_FIX), status=status) from None
        except ValueError:
            if status != 200:
                raise self._fail("%s answered HTTP %d (%r); re-run later, or %s"
                                 % (where, status, self._excerpt(raw), URL_FIX),
                                 status=status) from None
            raise self._fail("%s answered HTTP %d with something that is not JSON (%r): %s (the SDK base is like %s)"
                             % (where, status, self._excerpt(raw), URL_FIX,
                                DEFAULT_API_URL), status=status) from None
        if _nested_deeper(answer, MAX_JSON_DEPTH):
            raise self._fail("%s answered HTTP %d with JSON nested more than %d levels deep: not an SDK answer; %s"
                             % (where, status, MAX_JSON_DEPTH, URL_FIX), status=status)
        code = answer.get("code") if isinstance(answer, dict) else None
        if isinstance(code, bool) or not isinstance(code, int):
            raise self._fail("%s answered HTTP %d with JSON that is not the SDK's {code, msg, ...}: %s"
                             % (where, status, URL_FIX), status=status)
        return answer


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether decoded JSON nests more than limit lists or objects deep. Without recursion: every later use of the
    answer (a message quoting a value, a caller's walk) would otherwise meet the depth as a RecursionError."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


def _limit_socket_wait(response: Any, seconds: float) -> None:
    """Lets the next socket read wait no longer than what is left of the deadline, so a call never overruns it by
    a whole timeout_s. http.client gives no public handle on the socket: reached through the response's buffered
    reader (HTTPError wraps the response once more); when the chain is not there, the deadline is still checked
    between reads, and each read is bounded by timeout_s."""
    for holder in (response, getattr(response, "fp", None)):
        sock = getattr(getattr(getattr(holder, "fp", None), "raw", None), "_sock", None)
        if sock is not None and hasattr(sock, "settimeout"):
            try:
                sock.settimeout(max(seconds, 0.001))
            except OSError:
                pass  # already closed: the read that follows says so
            return


def _retry_after(headers: Any) -> Optional[float]:
    try:
        value = float(headers.get("Retry-After"))
    except (AttributeError, TypeError, ValueError):
        return None
    return value if value >= 0 else None
