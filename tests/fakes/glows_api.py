"""A fake Glows SDK HTTP API (v1) for the tests: the shapes the docs show (/tmp/glows-api.md, summarised in
README) and, where the docs say nothing, the guesses the client was written against (the contract: GUESS below).

    glows_api.py serve --bind 127.0.0.1 --port N --token TOKEN --state-file PATH [--price-cent 65]
                       [--schedule-s 0] [--image ID[=ROOT]]... [--snapshot ID=ROOT]... [--sandbox]
    glows_api.py cleanup --state-file PATH

Without --sandbox no machine exists: an instance is a record whose ssh access is ssh://<access host>:<a port
from a pool>, Running once schedule_s has passed. With --sandbox (root, the sandbox up) each instance is a real
sandbox node (plugins/module_utils/sandbox_node.py) made from the image's or snapshot's root directory, with
root password login, a firewall like the mapped topology's nodes and a port of the access gateway (psb-access,
nftables table `ip glows_fake_<hash of the state file>`, never the sandbox's own table) mapped to its sshd: SchedQueued until that
port answers with sshd's banner, then Running. Cancel destroys the node before it answers.

Every instance is written to the state file as it changes, so `cleanup` (a test's finalizer, or after a crash)
destroys what a server made even when that server is gone.

From Python (a pytest fixture):

    with serving(token="t", state_file=str(tmp_path / "glows.json")) as fake:
        fake.url   # http://127.0.0.1:<port>/sdk/v1, the client's api_url
        fake.root  # http://127.0.0.1:<port>, for /_fake/faults and /_fake/state

or fake = start(...); ...; fake.stop(); fake.cleanup().

Endpoints (relative to /sdk/v1; the envelope is always {"code", "msg"}, HTTP 200 even for errors):
    GET    /instance?request_id=ID | ?meta_key=KEY  -> {instance}                 (DOC)
    POST   /instance  JSON body                     -> {instance}                 (DOC)
    GET    /instance/list?page=P&per_page=N         -> {instances, total}         (GUESS: path, params, keys)
    GET    /instance/count                          -> {count}                    (GUESS)
    DELETE /instance?request_id=ID | ?meta_key=KEY  -> {}                         (GUESS: the method)
Fake only, no token (at / and under /sdk/v1): POST /_fake/faults, GET /_fake/state.

Error codes (GUESS: the docs list the numbers, never their meanings): 176 bad or missing token (third-party
report), 7 bad parameter, 10 instance not found, 17 custom_meta_key too long or already used, 88 no stock (fault
no_stock only), 1 internal error (fault list_fail_page, a sandbox failure). Fault list_instance_ids
({metaKey: instanceID}) makes the listing pair those keys with other ids (a lying listing; query stays true).
Other GUESSES here: a cancelled instance disappears and its meta key can be used again; both request_id and meta_key at once is a bad
parameter; a meta key with a control character is a bad parameter; list pages start at 1, per_page is 1..100
(default 20); while SchedQueued priceCent and the hardware figures are 0 (as in the docs' create sample) and the
access urls are "".
"""

import argparse
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import string
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

API_PREFIX = "/sdk/v1"
FAKE_PREFIX = "/_fake"
OK = 0
ERR_INTERNAL = 1
ERR_PARAM = 7
ERR_NOT_FOUND = 10
ERR_META_KEY = 17
ERR_NO_STOCK = 88
ERR_TOKEN = 176
MAX_ID = 64
MAX_GPU_NAME = 128
MAX_TEXT = 4096
MAX_BODY = 1 << 20
# A larger body is still read (and thrown away) up to this much, so the client sees the answer instead of a
# connection reset in the middle of its send; beyond it the connection is closed.
MAX_DRAIN = 64 << 20
PER_PAGE_DEFAULT = 20
PER_PAGE_MAX = 100
ID_ALPHABET = string.ascii_lowercase + string.digits
CATEGORIES = ("container", "vm")
STATUS_QUEUED = "SchedQueued"
STATUS_RUNNING = "Running"
# Not a documented status: a sandbox node that could not be made (the client must treat it as unknown).
STATUS_FAILED = "CreateFailed"
PORT_POOL = range(23000, 24000)
DEFAULT_IMAGE = "img-87p9kq26"  # the id in the docs' v1 example
IMAGE_NAME = "Ubuntu20.04 CUDA12.2 Python3.9"
SANDBOX_IMAGE_NAME = IMAGE_NAME + " (sandbox: Debian bullseye)"
GPU_RAM_MB = 24564
CPU_NAME_FALLBACK = "Intel(R) Xeon(R) Platinum 8352V CPU @ 2.10GHz"
RATE_LIMIT_TEXT = b"rate limit exceeded"

# The sandbox as roles/sandbox/defaults/main.yml and vars/main.yml define it (standard library only: no YAML).
SANDBOX_STATE_DIR = "/var/lib/prima-sandbox"
SANDBOX_NODES_DIR = SANDBOX_STATE_DIR + "/nodes"
SANDBOX_NFT_DIR = SANDBOX_STATE_DIR + "/nft"
SANDBOX_CCACHE = "/var/cache/prima-sandbox/ccache"
NODE_CCACHE = "/var/cache/ccache"
BRIDGE = "psb0"
GATEWAY = "10.77.0.1"
HUB = "10.77.0.2"
ACCESS = "10.77.0.3"
PREFIX_LEN = 24
SUBNET = "10.77.0.0/24"
ACCESS_NETNS = "psb-access"
ADDRESS_POOL = ["10.77.0.%d" % host for host in range(40, 100)]
ACCESS_TABLE_PREFIX = "glows_fake_"
NODE_TABLE = "glows_fake_node"
# 'g' and 6 characters of the instance id: the host side veth psbh-<name> fits IFNAMSIZ (15).
NODE_NAME = re.compile(r"g[a-z0-9]{6}")
SSHD_WAIT_S = 60.0

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANDBOX_NODE_PY = os.path.join(REPO, "plugins", "module_utils", "sandbox_node.py")


class FakeError(Exception):
    """The fake cannot serve as asked (the sandbox is not up, an image has no root directory)."""


class ApiError(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code
        self.msg = msg


def load_sandbox_node() -> ModuleType:
    """sandbox_node.py by file path: the fake runs outside Ansible's collection loader (a plain subprocess too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("glows_fake_sandbox_node", SANDBOX_NODE_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_figures() -> Dict[str, Any]:
    """The hardware a Running instance reports: this host's, so the figures are plausible and stable."""
    cpu_name, ram_mb = CPU_NAME_FALLBACK, 43008
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name") and ":" in line:
                    cpu_name = line.split(":", 1)[1].strip() or cpu_name
                    break
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    ram_mb = int(line.split()[1]) // 1024
                    break
    except (OSError, ValueError):
        pass
    try:
        disk_gb = shutil.disk_usage("/").total // 10 ** 9
    except OSError:
        disk_gb = 100
    return {"cpuName": cpu_name, "cpuCoresNum": os.cpu_count() or 10, "ramMB": ram_mb, "diskGB": disk_gb}


def write_json_atomic(path: str, data: Any) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
    # It holds every instance's root password (real ones, in sandbox mode): its owner's alone.
    with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(temp, path)


def read_state(path: str) -> Dict[str, Any]:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {"instances": []}
    if not isinstance(data, dict) or not isinstance(data.get("instances"), list):
        raise ValueError("%s is not a fake Glows state file" % path)
    return data


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_int(value: Any) -> bool:
    # JSON true is a Python int too: never a count or a port.
    return isinstance(value, int) and not isinstance(value, bool)


def _has_control(value: str) -> bool:
    return any(ord(char) < 32 or ord(char) == 127 for char in value)


def parse_ports(raw: Any) -> List[Dict[str, int]]:
    """`ports` is a JSON *string* (DOC): [{"port": 7890, "protocol": 2}], protocol 1 = SSH, 2 = HTTP."""
    if raw is None or raw == "":
        return []
    if not _is_text(raw):
        raise ApiError(ERR_PARAM, "ports must be a JSON string")
    try:
        ports = json.loads(raw)
    except ValueError:
        raise ApiError(ERR_PARAM, "ports is not valid JSON") from None
    if not isinstance(ports, list):
        raise ApiError(ERR_PARAM, "ports must be a JSON array")
    seen = set()
    out = []
    for item in ports:
        if not isinstance(item, dict) or set(item) - {"port", "protocol"}:
            raise ApiError(ERR_PARAM, "each port is {\"port\": N, \"protocol\": 1|2}")
        port, protocol = item.get("port"), item.get("protocol")
        if not _is_int(port) or not 1 <= port <= 65535 or not _is_int(protocol) or protocol not in (1, 2):
            raise ApiError(ERR_PARAM, "bad port entry %s" % json.dumps(item))
        if port in seen:
            raise ApiError(ERR_PARAM, "port %d given twice" % port)
        seen.add(port)
        out.append({"port": port, "protocol": protocol})
    return out


class SandboxBackend:
    """Real sandbox nodes behind the access gateway. Every call is made with the server's lock NOT held (they
    take seconds); the server serialises what must be (the access table) with its own lock here."""

    def __init__(self, state_file: str, log: Callable[[str], None]):
        self.sn = load_sandbox_node()
        self.log = log
        self.table = access_table(state_file)
        self.nft_file = os.path.join(SANDBOX_NFT_DIR, self.table + ".nft")
        self.nft_lock = threading.Lock()

    @staticmethod
    def check_ready() -> None:
        if os.geteuid() != 0:
            raise FakeError("--sandbox needs root (network namespaces, mounts, nftables)")
        missing = [what for what, present in (
            ("the bridge " + BRIDGE, os.path.exists("/sys/class/net/" + BRIDGE)),
            ("the access gateway namespace " + ACCESS_NETNS, os.path.exists("/run/netns/" + ACCESS_NETNS)),
        ) if not present]
        if missing:
            raise FakeError("the sandbox is not up (%s missing): make sandbox-up" % ", ".join(missing))

    def node(self, name: str) -> Any:
        return self.sn.Node(name, SANDBOX_NODES_DIR)

    def name_free(self, name: str) -> bool:
        return not self.node(name).exists()

    def binds(self) -> List[Dict[str, object]]:
        binds: List[Dict[str, object]] = [{"src": SANDBOX_CCACHE, "dest": NODE_CCACHE}]
        mirror = os.environ.get("PRIMA_CPP_MIRROR", "")
        if mirror:
            binds.append({"src": mirror, "dest": "/srv/prima-mirror", "readonly": True})
        return binds

    def create(self, fake: Dict[str, Any], password: str, cancelled: threading.Event) -> None:
        name, address = fake["node"], fake["address"]
        node = self.node(name)
        os.makedirs(SANDBOX_CCACHE, exist_ok=True)
        node.create(fake["source_root"], address, PREFIX_LEN, BRIDGE, GATEWAY, None, self.binds(),
                    root_password=password)
        if cancelled.is_set():
            return
        self.apply_node_firewall(name, address)

    def apply_node_firewall(self, name: str, address: str) -> None:
        """Like roles/sandbox/templates/node.nft.j2, but peers are every other address of the sandbox's subnet (the
        fake does not know which exist): the gateway, the hub and the access gateway stay reachable."""
        path = os.path.join(SANDBOX_NFT_DIR, "%s.nft" % name)
        rules = (
            "# written by tests/fakes/glows_api.py: fake Glows node %s\n"
            "table inet %s\n"
            "delete table inet %s\n"
            "table inet %s {\n"
            "    chain output {\n"
            "        type filter hook output priority filter; policy accept;\n"
            "        ip daddr %s ip daddr != { %s, %s, %s, %s } meta l4proto tcp reject with tcp reset\n"
            "        ip daddr %s ip daddr != { %s, %s, %s, %s } drop\n"
            "    }\n"
            "    chain input {\n"
            "        type filter hook input priority filter; policy accept;\n"
            "        tcp dport 22 ip saddr != %s reject with tcp reset\n"
            "    }\n"
            "}\n" % (name, NODE_TABLE, NODE_TABLE, NODE_TABLE, SUBNET, GATEWAY, HUB, ACCESS, address,
                     SUBNET, GATEWAY, HUB, ACCESS, address, ACCESS))
        os.makedirs(SANDBOX_NFT_DIR, exist_ok=True)
        write_text(path, rules)
        self.sn.run(["ip", "netns", "exec", self.sn.netns_name(name), "nft", "-f", path])

    def apply_access(self, mappings: List[Tuple[int, str, int]]) -> None:
        """This server's whole table of the access gateway, from the live instances' (public port, node
        address, node port): rewritten as one nft transaction, so a rule never lingers or goes missing."""
        with self.nft_lock:
            if not os.path.exists("/run/netns/" + ACCESS_NETNS):
                return
            if not mappings:
                self.sn.run(["ip", "netns", "exec", ACCESS_NETNS, "nft", "delete", "table", "ip", self.table],
                            check=False)
                if os.path.exists(self.nft_file):
                    os.remove(self.nft_file)
                return
            lines = ["        ip daddr %s tcp dport %d dnat to %s:%d" % (ACCESS, public, address, port)
                     for public, address, port in sorted(mappings)]
            rules = (
                "# written by tests/fakes/glows_api.py: the fake Glows instances' ports (never prima_access)\n"
                "table ip %s\n"
                "delete table ip %s\n"
                "table ip %s {\n"
                "    chain prerouting {\n"
                "        type nat hook prerouting priority dstnat; policy accept;\n"
                "%s\n"
                "    }\n"
                "    chain postrouting {\n"
                "        type nat hook postrouting priority srcnat; policy accept;\n"
                "        ct status dnat masquerade\n"
                "    }\n"
                "}\n" % (self.table, self.table, self.table, "\n".join(lines)))
            os.makedirs(SANDBOX_NFT_DIR, exist_ok=True)
            write_text(self.nft_file, rules)
            self.sn.run(["ip", "netns", "exec", ACCESS_NETNS, "nft", "-f", self.nft_file])

    def destroy(self, name: str) -> None:
        self.node(name).destroy()
        path = os.path.join(SANDBOX_NFT_DIR, "%s.nft" % name)
        if os.path.exists(path):
            os.remove(path)

    def alive(self) -> List[str]:
        if not os.path.isdir(SANDBOX_NODES_DIR):
            return []
        # Every fake's nodes, not only this server's: what a test asserts is that nothing is left.
        return sorted(entry for entry in os.listdir(SANDBOX_NODES_DIR) if NODE_NAME.fullmatch(entry))


def write_text(path: str, text: str) -> None:
    temp = path + ".tmp"
    with open(temp, "w") as handle:
        handle.write(text)
    os.replace(temp, path)


def sshd_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """sshd's banner through the access port: the whole path (gateway, dnat, node firewall, sshd) works."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


class FakeGlows:
    """The API's state and behaviour; the HTTP handler only parses and answers. One lock guards every record;
    the slow work (making and destroying nodes) runs outside it."""

    def __init__(self, token: str, state_file: str, price_cent: int = 65, schedule_s: float = 0.0,
                 images: Optional[Dict[str, Optional[str]]] = None, snapshots: Optional[Dict[str, str]] = None,
                 sandbox: bool = False, access_host: Optional[str] = None, log: Optional[Callable[[str], None]] = None):
        self.token = token
        self.state_file = os.path.abspath(state_file)
        self.images = dict(images) if images else {DEFAULT_IMAGE: None}
        self.snapshots = dict(snapshots or {})
        self.sandbox = sandbox
        self.access_host = access_host or (ACCESS if sandbox else "127.0.0.1")
        self.log = log or (lambda message: None)
        self.lock = threading.RLock()
        self.instances: Dict[str, Dict[str, Any]] = {}  # instanceID -> {"public": {...}, "fake": {...}}
        self.order: List[str] = []
        self.cancelled: Dict[str, threading.Event] = {}
        self.workers: Dict[str, threading.Thread] = {}
        self.gone: Dict[str, threading.Event] = {}  # set once a cancel has finished destroying
        self.faults: Dict[str, Any] = {"rate_limit_next": 0, "error_next": None, "schedule_s": float(schedule_s),
                                       "no_ssh_access": False, "price_cent": int(price_cent), "list_fail_page": None,
                                       "no_stock": False, "list_instance_ids": {}}
        self.figures = host_figures()
        self.backend: Optional[SandboxBackend] = None
        if sandbox:
            SandboxBackend.check_ready()
            for image_id, root in self.images.items():
                if not root or not os.path.isdir(root):
                    raise FakeError("image %s: %r is not a root directory" % (image_id, root))
            for snap_id, root in self.snapshots.items():
                if not os.path.isdir(root):
                    raise FakeError("snapshot %s: %r is not a root directory" % (snap_id, root))
            self.backend = SandboxBackend(self.state_file, self.log)
        self._load()

    # ---- persistence

    def _load(self) -> None:
        """Instances of an earlier server on the same state file carry on; a node whose making was cut short
        (the server died) is destroyed and its instance dropped, as its creation cannot resume."""
        state = read_state(self.state_file)
        dropped = []
        for record in state["instances"]:
            public, fake = record.get("public"), record.get("fake")
            if not isinstance(public, dict) or not isinstance(fake, dict):
                continue
            if fake.get("node") and (fake.get("phase") != "ready" or self.backend is None):
                dropped.append(record)
                continue
            self.instances[public["instanceID"]] = {"public": public, "fake": fake}
            self.order.append(public["instanceID"])
        if dropped and self.backend is None:
            raise FakeError("%s names sandbox nodes: clean it up first (glows_api.py cleanup)" % self.state_file)
        for record in dropped:
            destroy_record(record, self.backend)
        if dropped:
            self.log("dropped %d instance(s) whose node was being made when the last server stopped" % len(dropped))
        self._save()
        self._apply_access()

    def _save(self) -> None:
        with self.lock:
            records = [self.instances[key] for key in self.order]
            write_json_atomic(self.state_file, {"instances": records, "pid": os.getpid(), "sandbox": self.sandbox})

    # ---- helpers

    def _new_id(self) -> str:
        while True:
            suffix = "".join(secrets.choice(ID_ALPHABET) for dummy in range(8))
            node = "g" + suffix[:6]
            taken = any(record["fake"].get("node") == node for record in self.instances.values())
            if "ins-" + suffix in self.instances or taken:
                continue
            if self.backend is not None and not self.backend.name_free(node):
                continue
            return "ins-" + suffix

    def _free_address(self) -> str:
        used = {record["fake"].get("address") for record in self.instances.values()}
        for address in ADDRESS_POOL:
            if address not in used:
                return address
        raise ApiError(ERR_NO_STOCK, "no address left in the fake's pool")

    def _find(self, params: Dict[str, str]) -> Dict[str, Any]:
        request_id, meta_key = params.get("request_id"), params.get("meta_key")
        if request_id is not None and meta_key is not None:
            raise ApiError(ERR_PARAM, "give request_id or meta_key, not both")
        if request_id is None and meta_key is None:
            raise ApiError(ERR_PARAM, "request_id or meta_key is required")
        value = request_id if request_id is not None else meta_key
        assert value is not None
        if not value or len(value) > MAX_ID or _has_control(value):
            raise ApiError(ERR_PARAM, "request_id and meta_key are 1 to %d characters, no control characters" % MAX_ID)
        for record in self.instances.values():
            public = record["public"]
            # DOC: a legacy hash id (the id without its ins- prefix) is accepted too.
            if request_id is not None and request_id in (public["instanceID"], public["instanceID"][4:]):
                return record
            if meta_key is not None and public["metaKey"] == meta_key:
                return record
        raise ApiError(ERR_NOT_FOUND, "instance not found")

    def _refresh(self, record: Dict[str, Any]) -> None:
        """SchedQueued -> Running once the machine is there and the schedule has passed (status is lazy)."""
        public, fake = record["public"], record["fake"]
        if public["status"] != STATUS_QUEUED or fake["phase"] != "ready" or time.time() < fake["running_after"]:
            return
        public["status"] = STATUS_RUNNING
        public["priceCent"] = fake["price_cent"]
        public["hardware"] = dict(fake["hardware"])
        for access in public["accesses"]:
            scheme = "ssh" if access["protocol"] == "ssh" else "http"
            access["url"] = "%s://%s:%d" % (scheme, self.access_host, fake["public_ports"][str(access["listenPort"])])
        self._save()

    def _mappings(self) -> List[Tuple[int, str, int]]:
        return [(public, record["fake"]["address"], int(port))
                for record in self.instances.values() if record["fake"].get("address")
                for port, public in record["fake"]["public_ports"].items()]

    def _apply_access(self) -> None:
        if self.backend is not None:
            self.backend.apply_access(self._mappings())

    # ---- the API

    def take_fault(self) -> Optional[Tuple[int, Any]]:
        """Faults that apply to any API request: (429, text) or (200, {code, msg}), counted down."""
        with self.lock:
            if self.faults["rate_limit_next"] > 0:
                self.faults["rate_limit_next"] -= 1
                return 429, RATE_LIMIT_TEXT
            error = self.faults["error_next"]
            if error and error["count"] > 0:
                error["count"] -= 1
                if error["count"] == 0:
                    self.faults["error_next"] = None
                return 200, {"code": error["code"], "msg": error["msg"]}
        return None

    def authorised(self, header: Optional[str], query: Optional[str]) -> bool:
        # DOC: the server copies the Authorization query parameter into the header: the same "Bearer <token>".
        value = header if header is not None else query
        expected = "Bearer " + self.token
        return value is not None and secrets.compare_digest(value.encode(), expected.encode())

    def query(self, params: Dict[str, str]) -> Dict[str, Any]:
        with self.lock:
            record = self._find(params)
            self._refresh(record)
            return {"instance": json.loads(json.dumps(record["public"]))}

    def list(self, params: Dict[str, str]) -> Dict[str, Any]:
        page = _int_param(params, "page", 1, 1, 10 ** 6)
        per_page = _int_param(params, "per_page", PER_PAGE_DEFAULT, 1, PER_PAGE_MAX)
        with self.lock:
            if self.faults["list_fail_page"] == page:
                raise ApiError(ERR_INTERNAL, "internal error")
            for record in self.instances.values():
                self._refresh(record)
            ordered = [self.instances[key]["public"] for key in self.order]
            chunk = json.loads(json.dumps(ordered[(page - 1) * per_page:page * per_page]))
            # A listing that lies: the instanceID shown for a metaKey is another instance's (query is truthful).
            for public in chunk:
                public["instanceID"] = self.faults["list_instance_ids"].get(public["metaKey"], public["instanceID"])
            return {"instances": chunk, "total": len(ordered)}

    def count(self, params: Dict[str, str]) -> Dict[str, Any]:
        with self.lock:
            return {"count": len(self.instances)}

    def create(self, body: Dict[str, Any]) -> Dict[str, Any]:
        spec = self._validate(body)
        with self.lock:
            if self.faults["no_stock"]:
                raise ApiError(ERR_NO_STOCK, "no stock of %s in %s" % (spec["gpu_name"], spec["region_name"]))
            # Checked and taken under one lock: of two creates with the same key, exactly one wins.
            if any(record["public"]["metaKey"] == spec["custom_meta_key"] for record in self.instances.values()):
                raise ApiError(ERR_META_KEY, "custom_meta_key %s is already used" % json.dumps(spec["custom_meta_key"]))
            instance_id = self._new_id()
            record = self._new_record(instance_id, spec)
            self.instances[instance_id] = record
            self.order.append(instance_id)
            self._save()
            answer = {"instance": json.loads(json.dumps(record["public"]))}
            if self.backend is None:
                record["fake"]["phase"] = "ready"
                self._save()
                return answer
            cancelled = threading.Event()
            self.cancelled[instance_id] = cancelled
            worker = threading.Thread(target=self._make_node, args=(instance_id, cancelled),
                                      name="glows-fake-" + instance_id, daemon=True)
            self.workers[instance_id] = worker
            worker.start()
            return answer

    def _validate(self, body: Dict[str, Any]) -> Dict[str, Any]:
        image, snap = body.get("from_image_id"), body.get("from_snap_id")
        if (image is None) == (snap is None):
            raise ApiError(ERR_PARAM, "give exactly one of from_image_id and from_snap_id")
        source = image if image is not None else snap
        if not _is_text(source) or not source or len(source) > MAX_ID:
            raise ApiError(ERR_PARAM, "from_image_id/from_snap_id is a string of 1 to %d characters" % MAX_ID)
        if image is not None and image not in self.images:
            raise ApiError(ERR_PARAM, "unknown image %s" % json.dumps(image))
        if snap is not None and snap not in self.snapshots:
            raise ApiError(ERR_PARAM, "unknown snapshot %s" % json.dumps(snap))
        gpu = body.get("gpu_name")
        if not _is_text(gpu) or not gpu or len(gpu) > MAX_GPU_NAME or _has_control(gpu):
            raise ApiError(ERR_PARAM, "gpu_name is required: 1 to %d characters" % MAX_GPU_NAME)
        key = body.get("custom_meta_key")
        if not _is_text(key) or not key:
            raise ApiError(ERR_PARAM, "custom_meta_key is required")
        if len(key) > MAX_ID:
            raise ApiError(ERR_META_KEY, "custom_meta_key is longer than %d characters" % MAX_ID)
        if _has_control(key):
            raise ApiError(ERR_PARAM, "custom_meta_key has a control character")
        category = body.get("instance_category")
        if category not in CATEGORIES:
            raise ApiError(ERR_PARAM, "instance_category is container or vm")
        region = body.get("region_name")
        if not _is_text(region) or not region or len(region) > MAX_ID or _has_control(region):
            raise ApiError(ERR_PARAM, "region_name is required")
        for name in ("remark", "envs", "cmd", "public_ip_id"):
            value = body.get(name, "")
            if not _is_text(value) or len(value) > MAX_TEXT:
                raise ApiError(ERR_PARAM, "%s must be a string of at most %d characters" % (name, MAX_TEXT))
        ports = parse_ports(body.get("ports"))
        return {"image": image, "snap": snap, "gpu_name": gpu, "custom_meta_key": key, "instance_category": category,
                "region_name": region, "remark": body.get("remark", ""), "envs": body.get("envs", ""),
                "cmd": body.get("cmd", ""), "ports": ports}

    def _new_record(self, instance_id: str, spec: Dict[str, Any]) -> Dict[str, Any]:
        no_ssh = bool(self.faults["no_ssh_access"])
        listen = [] if no_ssh else [22]
        accesses = [] if no_ssh else [{"protocol": "ssh", "listenPort": 22, "url": ""}]
        for port in spec["ports"]:
            if port["port"] in listen or (no_ssh and port["protocol"] == 1):
                continue
            listen.append(port["port"])
            accesses.append({"protocol": "ssh" if port["protocol"] == 1 else "http", "listenPort": port["port"],
                             "url": ""})
        public_ports: Dict[str, int] = {}
        for port in listen:
            used = {p for record in self.instances.values() for p in record["fake"]["public_ports"].values()}
            free = next((candidate for candidate in PORT_POOL
                         if candidate not in used and candidate not in public_ports.values()), None)
            if free is None:
                raise ApiError(ERR_NO_STOCK, "no access port left in the fake's pool")
            public_ports[str(port)] = free
        image_root = self.images.get(spec["image"]) if spec["image"] else None
        base_image = None
        if spec["image"]:
            base_image = {"imageID": spec["image"], "imageName": SANDBOX_IMAGE_NAME if image_root else IMAGE_NAME}
        base_snap = {"snapID": spec["snap"], "snapName": spec["snap"]} if spec["snap"] else None
        public = {
            "instanceID": instance_id, "category": spec["instance_category"], "status": STATUS_QUEUED,
            "priceCent": 0,
            "hardware": {"gpuName": spec["gpu_name"], "cpuName": "", "gpuNum": 0, "gpuRamMB": 0, "cpuCoresNum": 0,
                         "ramMB": 0, "diskGB": 0},
            "baseImage": base_image, "baseSnap": base_snap,
            "sshCred": {"user": "root", "password": secrets.token_urlsafe(12)},
            "accesses": accesses, "domain": 0, "createTime": {"seconds": int(time.time())},
            "cmd": spec["cmd"], "envs": spec["envs"], "remark": spec["remark"], "metaKey": spec["custom_meta_key"],
            "sourceType": "SourceSDK", "regionName": spec["region_name"],
        }
        fake: Dict[str, Any] = {
            "phase": "making", "running_after": time.time() + float(self.faults["schedule_s"]),
            "price_cent": int(self.faults["price_cent"]), "public_ports": public_ports,
            # In the docs' order: gpuName, cpuName, gpuNum, gpuRamMB, cpuCoresNum, ramMB, diskGB.
            "hardware": {"gpuName": spec["gpu_name"], "cpuName": self.figures["cpuName"], "gpuNum": 1,
                         "gpuRamMB": GPU_RAM_MB, "cpuCoresNum": self.figures["cpuCoresNum"],
                         "ramMB": self.figures["ramMB"], "diskGB": self.figures["diskGB"]},
        }
        if self.backend is not None:
            fake["node"] = "g" + instance_id[4:10]
            fake["address"] = self._free_address()
            fake["source_root"] = image_root if spec["image"] else self.snapshots[spec["snap"]]
        return {"public": public, "fake": fake}

    def _make_node(self, instance_id: str, cancelled: threading.Event) -> None:
        assert self.backend is not None
        with self.lock:
            record = self.instances[instance_id]
            fake = dict(record["fake"])
            password = record["public"]["sshCred"]["password"]
        started = time.monotonic()
        try:
            self.backend.create(fake, password, cancelled)
            if cancelled.is_set():
                return
            with self.lock:
                self._apply_access()
            port = fake["public_ports"]["22"] if "22" in fake["public_ports"] else None
            deadline = time.monotonic() + SSHD_WAIT_S
            while port is not None and not cancelled.is_set() and not sshd_answers(self.access_host, port):
                if time.monotonic() > deadline:
                    raise RuntimeError("sshd of %s did not answer on %s:%d" % (fake["node"], self.access_host, port))
                time.sleep(0.2)
            if cancelled.is_set():
                return
            with self.lock:
                record["fake"]["phase"] = "ready"
                record["fake"]["made_s"] = round(time.monotonic() - started, 2)
                self._save()
            self.log("%s: node %s at %s up in %.1f s" % (instance_id, fake["node"], fake["address"],
                                                         time.monotonic() - started))
        except Exception as error:  # noqa: BLE001 - any failure is the instance's, reported through its status
            self.log("%s: making node %s failed: %s" % (instance_id, fake["node"], error))
            if cancelled.is_set():
                return
            try:
                self.backend.destroy(fake["node"])
            except Exception as again:  # noqa: BLE001 - reported; cleanup tries again
                self.log("%s: destroying the failed node %s: %s" % (instance_id, fake["node"], again))
            with self.lock:
                record["public"]["status"] = STATUS_FAILED
                record["fake"]["phase"] = "failed"
                record["fake"]["error"] = str(error)
                self._save()

    def cancel(self, params: Dict[str, str]) -> Dict[str, Any]:
        with self.lock:
            try:
                record = self._find(params)
            except ApiError as error:
                in_flight = list(self.gone.values()) if error.code == ERR_NOT_FOUND else []
                if not in_flight:
                    raise
                record = None
            else:
                instance_id = record["public"]["instanceID"]
                # Gone from query and list at once; the node goes before this answers.
                self.instances.pop(instance_id)
                self.order.remove(instance_id)
                done = threading.Event()
                self.gone[instance_id] = done
                if instance_id in self.cancelled:
                    self.cancelled[instance_id].set()
                worker = self.workers.pop(instance_id, None)
        if record is None:
            # Maybe a second cancel of an instance another one is destroying: answer once that one is done, so
            # "not found" always means nothing is left.
            for event in in_flight:
                event.wait(120)
            raise ApiError(ERR_NOT_FOUND, "instance not found")
        try:
            if worker is not None:
                worker.join()
            if self.backend is not None and record["fake"].get("node"):
                self.backend.destroy(record["fake"]["node"])
            with self.lock:
                self._apply_access()
                self._save()
        except Exception:
            # Not gone: back in the records (and the state file) so that a cleanup tries again.
            with self.lock:
                record["public"]["status"] = STATUS_FAILED
                self.instances[instance_id] = record
                self.order.append(instance_id)
                self._save()
            raise
        finally:
            with self.lock:
                self.gone.pop(instance_id, None)
                self.cancelled.pop(instance_id, None)
            done.set()
        return {}

    # ---- fake-only

    def set_faults(self, body: Dict[str, Any]) -> Dict[str, Any]:
        with self.lock:
            new = dict(self.faults)
            for key, value in body.items():
                if key in ("rate_limit_next",):
                    if not _is_int(value) or value < 0:
                        raise ApiError(ERR_PARAM, "%s is a count" % key)
                    new[key] = value
                elif key == "error_next":
                    if value is None:
                        new[key] = None
                        continue
                    if not isinstance(value, dict) or not _is_int(value.get("code")):
                        raise ApiError(ERR_PARAM, "error_next is {code, msg, count}")
                    count = value.get("count", 1)
                    if not _is_int(count) or count < 0:
                        raise ApiError(ERR_PARAM, "error_next.count is a count")
                    new[key] = {"code": value["code"], "msg": str(value.get("msg", "")), "count": count}
                elif key == "schedule_s":
                    if not (_is_int(value) or isinstance(value, float)) or value < 0:
                        raise ApiError(ERR_PARAM, "schedule_s is seconds")
                    new[key] = float(value)
                elif key in ("no_ssh_access", "no_stock"):
                    if not isinstance(value, bool):
                        raise ApiError(ERR_PARAM, "%s is true or false" % key)
                    new[key] = value
                elif key == "price_cent":
                    if not _is_int(value) or value < 0:
                        raise ApiError(ERR_PARAM, "price_cent is cents")
                    new[key] = value
                elif key == "list_instance_ids":
                    if not isinstance(value, dict) or not all(_is_text(k) and _is_text(v) for k, v in value.items()):
                        raise ApiError(ERR_PARAM, "list_instance_ids is {metaKey: instanceID}")
                    new[key] = dict(value)
                elif key == "list_fail_page":
                    if value is not None and (not _is_int(value) or value < 1):
                        raise ApiError(ERR_PARAM, "list_fail_page is a page number or null")
                    new[key] = value
                else:
                    raise ApiError(ERR_PARAM, "unknown fault %s" % json.dumps(key))
            self.faults = new
            return {"faults": json.loads(json.dumps(new))}

    def state(self) -> Dict[str, Any]:
        with self.lock:
            for record in self.instances.values():
                self._refresh(record)
            instances = [dict(self.instances[key]["public"], _fake=self.instances[key]["fake"]) for key in self.order]
            nodes = self.backend.alive() if self.backend is not None else []
            table = self.backend.table if self.backend is not None else None
            return json.loads(json.dumps({"instances": instances, "nodes": nodes, "faults": self.faults,
                                          "access_table": table}))

    def cleanup(self) -> int:
        """Cancel everything (the nodes destroyed, the access table removed); returns how many instances."""
        with self.lock:
            ids = list(self.order)
        count = 0
        for instance_id in ids:
            try:
                self.cancel({"request_id": instance_id})
                count += 1
            except ApiError:
                pass
        cleanup_state_file(self.state_file)
        return count


def _int_param(params: Dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not low <= int(raw) <= high:
        raise ApiError(ERR_PARAM, "%s is a whole number from %d to %d" % (name, low, high))
    return int(raw)


def access_table(state_file: str) -> str:
    """The access gateway's nft table of the server on this state file: each fake's own (two fakes, or a unit test's
    cleanup while a sandbox-mode fake serves, never touch another's rules; the sandbox's prima_access is never
    touched)."""
    return ACCESS_TABLE_PREFIX + hashlib.sha256(os.path.abspath(state_file).encode()).hexdigest()[:8]


def destroy_record(record: Dict[str, Any], backend: Optional[SandboxBackend]) -> None:
    node = record.get("fake", {}).get("node")
    if not node or backend is None:
        return
    backend.destroy(node)


def cleanup_state_file(state_file: str) -> int:
    """What a server on this state file made, gone: its nodes, their firewall files, its access table. For a
    finalizer (the server stopped, maybe crashed). Returns how many instances there were."""
    state = read_state(state_file)
    records = [record for record in state["instances"] if isinstance(record, dict)]
    backend = None
    table_file = os.path.join(SANDBOX_NFT_DIR, access_table(state_file) + ".nft")
    if any(record.get("fake", {}).get("node") for record in records) or os.path.exists(table_file):
        if os.geteuid() != 0:
            raise FakeError("%s names sandbox nodes: cleanup needs root" % state_file)
        backend = SandboxBackend(state_file, lambda message: None)
    for record in records:
        destroy_record(record, backend)
    if backend is not None:
        backend.apply_access([])
    if os.path.exists(state_file):
        write_json_atomic(state_file, {"instances": [], "pid": None, "sandbox": state.get("sandbox", False)})
    return len(records)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "GlowsFake/1"
    timeout = 30
    fake: FakeGlows  # set on the subclass the server makes

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's own name
        self.fake.log("%s %s" % (self.address_string(), format % args))

    def _send(self, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload: Dict[str, Any], status: int = 200, close: bool = False) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", close)

    def _params(self, query: str) -> Dict[str, str]:
        try:
            parsed = parse_qs(query, keep_blank_values=True, strict_parsing=False, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise ApiError(ERR_PARAM, "the query string is not valid") from None
        params = {}
        for name, values in parsed.items():
            if len(values) != 1:
                raise ApiError(ERR_PARAM, "%s given more than once" % name)
            params[name] = values[0]
        return params

    def _body(self) -> Tuple[Optional[Dict[str, Any]], bool]:
        """(the JSON object, whether to close the connection); raises ApiError for anything else."""
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(ERR_PARAM, "send the body with a Content-Length")
        raw_length = self.headers.get("Content-Length")
        if raw_length is None or not re.fullmatch(r"[0-9]{1,12}", raw_length.strip()):
            raise ApiError(ERR_PARAM, "a JSON body with a Content-Length is required")
        length = int(raw_length)
        if length > MAX_BODY:
            if length > MAX_DRAIN:
                return None, True
            left = length
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    return None, True
                left -= len(chunk)
            return None, False
        data = self.rfile.read(length)
        if len(data) != length:
            return None, True
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ApiError(ERR_PARAM, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(ERR_PARAM, "the body is a JSON object")
        return body, False

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        if path.startswith(API_PREFIX + FAKE_PREFIX):
            path = path[len(API_PREFIX):]
        try:
            if path.startswith(FAKE_PREFIX + "/"):
                self._fake_endpoint(path)
                return
            if not path.startswith(API_PREFIX + "/"):
                self._json({"code": ERR_NOT_FOUND, "msg": "no such path"}, 404)
                return
            route = path[len(API_PREFIX):]
            routes = {("GET", "/instance"): "query", ("POST", "/instance"): "create",
                      ("DELETE", "/instance"): "cancel", ("GET", "/instance/list"): "list",
                      ("GET", "/instance/count"): "count"}
            if not any(known == route for dummy, known in routes):
                self._json({"code": ERR_NOT_FOUND, "msg": "no such path"}, 404)
                return
            action = routes.get((self.command, route))
            if action is None:
                self._json({"code": ERR_PARAM, "msg": "method not allowed"}, 405)
                return
            self._api(action, split.query)
        except ApiError as error:
            self._json({"code": error.code, "msg": error.msg})

    def _api(self, action: str, query: str) -> None:
        close = False
        body: Optional[Dict[str, Any]] = None
        if action == "create":
            # The body is read first in any case: an answer sent before it would reset the client's send.
            try:
                body, close = self._body()
            except ApiError as error:
                body_error: Optional[ApiError] = error
            else:
                body_error = None if body is not None else ApiError(ERR_PARAM, "the body is larger than %d bytes"
                                                                    % MAX_BODY)
        fault = self.fake.take_fault()
        if fault is not None:
            status, payload = fault
            if status == 429:
                self._send(429, payload, "text/plain; charset=utf-8", close)
            else:
                self._json(payload, status, close)
            return
        params = self._params(query)
        header = self.headers.get("Authorization")
        if not self.fake.authorised(header, params.pop("Authorization", None)):
            self._json({"code": ERR_TOKEN, "msg": "token is invalid or expired"}, close=close)
            return
        if action == "create":
            if body_error is not None:
                raise body_error
            assert body is not None
            self._json(dict({"code": OK, "msg": ""}, **self.fake.create(body)), close=close)
            return
        handler = {"query": self.fake.query, "cancel": self.fake.cancel, "list": self.fake.list,
                   "count": self.fake.count}[action]
        self._json(dict({"code": OK, "msg": ""}, **handler(params)))

    def _fake_endpoint(self, path: str) -> None:
        if path == FAKE_PREFIX + "/faults" and self.command == "POST":
            body, close = self._body()
            if body is None:
                raise ApiError(ERR_PARAM, "the body is too large")
            self._json(dict({"code": OK, "msg": ""}, **self.fake.set_faults(body)), close=close)
        elif path == FAKE_PREFIX + "/state" and self.command == "GET":
            self._json(dict({"code": OK, "msg": ""}, **self.fake.state()))
        else:
            self._json({"code": ERR_NOT_FOUND, "msg": "no such path"}, 404)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()


class _HTTPServer(ThreadingHTTPServer):
    # socketserver's backlog of 5 resets a burst of clients (a test's concurrent creates) before accept.
    request_queue_size = 128


class Server:
    """A running fake: its HTTP server in a thread. url is the client's api_url, root the fake's own endpoints."""

    def __init__(self, fake: FakeGlows, bind: str, port: int):
        handler = type("BoundHandler", (Handler,), {"fake": fake})
        self.fake = fake
        self.httpd = _HTTPServer((bind, port), handler)
        self.httpd.daemon_threads = True
        host, bound_port = self.httpd.server_address[:2]
        shown = "[%s]" % host if ":" in str(host) else host
        self.root = "http://%s:%d" % (shown, bound_port)
        self.url = self.root + API_PREFIX
        self.port = bound_port
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), name="glows-fake-http", daemon=True)

    def start(self) -> "Server":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop answering; the instances (and nodes) stay: cleanup() removes them."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def cleanup(self) -> int:
        return self.fake.cleanup()


def start(token: str, state_file: str, bind: str = "127.0.0.1", port: int = 0, price_cent: int = 65,
          schedule_s: float = 0.0, images: Optional[Dict[str, Optional[str]]] = None,
          snapshots: Optional[Dict[str, str]] = None, sandbox: bool = False, access_host: Optional[str] = None,
          log: Optional[Callable[[str], None]] = None) -> Server:
    """A fake serving in a thread of this process (port 0: a free port, see .url)."""
    fake = FakeGlows(token, state_file, price_cent=price_cent, schedule_s=schedule_s, images=images,
                     snapshots=snapshots, sandbox=sandbox, access_host=access_host, log=log)
    return Server(fake, bind, port).start()


@contextlib.contextmanager
def serving(token: str, state_file: str, **kwargs: Any) -> Iterator[Server]:
    """start(), then stop() and cleanup() however the block ends."""
    server = start(token, state_file, **kwargs)
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.cleanup()


def plain(value: Any) -> Any:
    """ansible-inventory's JSON with the inventory plugin's strings unwrapped: it marks them unsafe,
    {"__ansible_unsafe": "..."}."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def post_faults(server: "Server", **switches: Any) -> Dict[str, Any]:
    """Set fault switches through the fake's own endpoint, as a test sees it (POST /_fake/faults)."""
    request = urllib.request.Request(server.root + "/_fake/faults", data=json.dumps(switches).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    if answer.get("code") != 0:
        raise AssertionError("the fake refused the faults %r: %r" % (switches, answer))
    return answer


def _pairs(values: List[str], what: str, need_path: bool) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for value in values:
        key, sep, path = value.partition("=")
        if not key or (need_path and not path):
            raise SystemExit("--%s %s: give ID=ROOT" % (what, value))
        out[key] = os.path.abspath(path) if path else None
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="answer like the Glows SDK API until SIGTERM or SIGINT")
    serve.add_argument("--bind", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    serve.add_argument("--token", required=True)
    serve.add_argument("--state-file", required=True)
    serve.add_argument("--price-cent", type=int, default=65)
    serve.add_argument("--schedule-s", type=float, default=0.0)
    serve.add_argument("--image", action="append", default=[], help="ID or ID=ROOT (ROOT: the node's root, --sandbox)")
    serve.add_argument("--snapshot", action="append", default=[], help="ID=ROOT")
    serve.add_argument("--sandbox", action="store_true", help="a real sandbox node per instance (root)")
    serve.add_argument("--access-host", default=None, help="the host in access urls (127.0.0.1; %s with --sandbox)"
                       % ACCESS)
    serve.add_argument("--quiet", action="store_true")
    clean = commands.add_parser("cleanup", help="destroy everything a server on this state file made")
    clean.add_argument("--state-file", required=True)
    args = parser.parse_args(argv)
    if args.command == "cleanup":
        try:
            count = cleanup_state_file(args.state_file)
        except (FakeError, ValueError) as error:
            sys.stderr.write("glows_api.py: %s\n" % error)
            return 2
        print("cleaned up %d instance(s)" % count)
        return 0

    def log(message: str) -> None:
        if not args.quiet:
            sys.stderr.write("%s %s\n" % (time.strftime("%H:%M:%S"), message))
            sys.stderr.flush()

    images = _pairs(args.image, "image", args.sandbox)
    snapshots = {key: str(path) for key, path in _pairs(args.snapshot, "snapshot", True).items()}
    try:
        server = start(args.token, args.state_file, bind=args.bind, port=args.port, price_cent=args.price_cent,
                       schedule_s=args.schedule_s, images=images or None, snapshots=snapshots, sandbox=args.sandbox,
                       access_host=args.access_host, log=log)
    except FakeError as error:
        sys.stderr.write("glows_api.py: %s\n" % error)
        return 2
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *dummy: stopping.set())
    # One line a parent process can wait for (port 0 picks a free port).
    print("listening on %s" % server.url, flush=True)
    stopping.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
