"""Glows instances as Ansible hosts: which ones, in which order, under which name, with which variables.

Pure functions over the instance objects of the SDK API (plugins/plugin_utils/glows/api.py), used by the inventory
plugin prima.cluster.glows. The root password (sshCred.password) never becomes a host variable and never reaches
the inventory cache: the first contact takes it from the API itself (lookup prima.cluster.glows_ssh_password).
"""

import copy
import ipaddress
import math
import re
import urllib.parse
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.prima.cluster.plugins.plugin_utils.glows.api import GlowsError

SAFE_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")
# An access host as DNS spells one (RFC 1123 labels); anything else (a leading '-', '=', spaces) could reach ssh as
# an option rather than a host.
DNS_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
MIB_PER_GIB = 1024


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _label(instance: Mapping[str, Any]) -> str:
    return "instance %s (metaKey %s)" % (_text(instance.get("instanceID")) or "?", _text(instance.get("metaKey")) or "?")


def ssh_access(instance: Mapping[str, Any]) -> Tuple[str, int]:
    """The public (host, port) of the instance's SSH access. Glows maps the container's port 22 to a port on an
    access host and gives it as url ssh://host:port; url is empty while the instance is queued."""
    accesses = instance.get("accesses")
    found = [access for access in (accesses if isinstance(accesses, list) else [])
             if isinstance(access, Mapping) and _text(access.get("protocol")).lower() == "ssh"
             and _text(access.get("url")).strip()]
    if not found:
        raise GlowsError("%s has no SSH access yet (accesses has no ssh url): wait until it is Running, or create it "
                         "with port 22 exported" % _label(instance))
    # Port 22 inside is the node's sshd; another exported SSH port would be something else's.
    found.sort(key=lambda access: 0 if _int(access.get("listenPort")) == 22 else 1)
    url = _text(found[0].get("url")).strip()
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port if parts.port is not None else 22
    except ValueError:
        parts, port = None, 0
    if (parts is None or parts.scheme.lower() != "ssh" or not access_host_ok(parts.hostname or "")
            or not 0 < port < 65536 or parts.username is not None or parts.password is not None
            or parts.path not in ("", "/") or parts.query or parts.fragment):
        raise GlowsError("%s has an SSH access url that is not ssh://host:port with a host name or IP address (%r): "
                         "report it to Glows, or reach it with a static inventory" % (_label(instance), url[:120]))
    return parts.hostname, port


def access_host_ok(host: str) -> bool:
    """A DNS host name or an IP address, nothing else: it becomes ansible_host, which ssh is handed as it is."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(DNS_NAME.fullmatch(host))


def host_name(instance: Mapping[str, Any]) -> str:
    """The metaKey (the name the user gave at creation) when it can be a host name, else the instanceID."""
    for candidate in (_text(instance.get("metaKey")), _text(instance.get("instanceID"))):
        if SAFE_HOST_NAME.fullmatch(candidate) and not candidate.startswith("-"):
            return candidate
    raise GlowsError("%s has neither a metaKey nor an instanceID usable as a host name ([A-Za-z0-9._-]+): "
                     "filter it out with meta_key_prefix, remark or regions" % _label(instance))


def _vram_gib(hardware: Mapping[str, Any]) -> Optional[float]:
    per_gpu = _int(hardware.get("gpuRamMB"))
    gpus = _int(hardware.get("gpuNum"))
    if not per_gpu or per_gpu <= 0:
        return None
    # GUESS (api.py): gpuRamMB is per GPU. Rounded down to 0.01 GiB, so never more than the card has.
    total_mib = per_gpu * (gpus if gpus and gpus > 0 else 1)
    return math.floor(total_mib * 100 / MIB_PER_GIB) / 100


def instance_hostvars(instance: Mapping[str, Any]) -> Dict[str, Any]:
    """The host variables of one instance: how to reach it, what it has, what it costs. Never the password, never
    sshCred as a whole. gpu_mem is the node's VRAM in GiB (as prima.cpp's --gpu-mem and the inventory's gpu_mem
    mean it), absent when the API does not know it yet."""
    host, port = ssh_access(instance)
    hardware = _mapping(instance.get("hardware"))
    image = _mapping(instance.get("baseImage"))
    snap = _mapping(instance.get("baseSnap"))
    ram_mb = _int(hardware.get("ramMB"))
    variables = {
        "ansible_host": host,
        "ansible_port": port,
        "gpu_name": _text(hardware.get("gpuName")),
        "glows_gpu_count": _int(hardware.get("gpuNum")),
        "glows_cpu_cores": _int(hardware.get("cpuCoresNum")),
        "glows_ram_gib": round(ram_mb / MIB_PER_GIB, 2) if ram_mb is not None else None,
        "glows_disk_gib": _int(hardware.get("diskGB")),
        "glows_price_cent": _int(instance.get("priceCent")),
        "glows_region": _text(instance.get("regionName")),
        "glows_image": (_text(image.get("imageName")) or _text(snap.get("snapName")) or _text(image.get("imageID"))
                        or _text(snap.get("snapID"))),
        "glows_instance_id": _text(instance.get("instanceID")),
        "glows_meta_key": _text(instance.get("metaKey")),
        "glows_remark": _text(instance.get("remark")),
        "glows_status": _text(instance.get("status")),
        "glows_created": _int(_mapping(instance.get("createTime")).get("seconds")),
    }  # type: Dict[str, Any]
    user = _text(_mapping(instance.get("sshCred")).get("user"))
    if user:
        variables["ansible_user"] = user
    vram = _vram_gib(hardware)
    if vram is not None:
        variables["gpu_mem"] = vram
    return variables


def select(instances: Iterable[Mapping[str, Any]], statuses: Sequence[str] = ("Running",), meta_key_prefix: str = "",
           remark: str = "", regions: Sequence[str] = ()) -> List[Mapping[str, Any]]:
    """The instances that pass every filter given; an empty filter passes all. Statuses and regions are compared
    as the API spells them; the prefix is a plain prefix of metaKey, the remark the whole remark."""
    chosen = []
    for instance in instances:
        if statuses and _text(instance.get("status")) not in statuses:
            continue
        if meta_key_prefix and not _text(instance.get("metaKey")).startswith(meta_key_prefix):
            continue
        if remark and _text(instance.get("remark")) != remark:
            continue
        if regions and _text(instance.get("regionName")) not in regions:
            continue
        chosen.append(instance)
    return chosen


def _natural(text: str) -> Tuple[Tuple[int, str, int], ...]:
    # re.split with a group alternates text and digits, text first, so equal positions compare equal types.
    parts = re.split(r"(\d+)", text)
    return tuple((0, part, 0) if index % 2 == 0 else (1, "", int(part)) for index, part in enumerate(parts))


def rank_order(instances: Iterable[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """Rank order: metaKey in natural order (x-2 before x-10: the rent playbook numbers its keys), then creation
    time, then instanceID, so the same instances always give the same ranks."""
    def key(instance: Mapping[str, Any]) -> Tuple[Any, ...]:
        created = _int(_mapping(instance.get("createTime")).get("seconds"))
        return (_natural(_text(instance.get("metaKey"))), created if created is not None else 0,
                _text(instance.get("instanceID")))
    return sorted(instances, key=key)


def without_password(instance: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy without sshCred.password: what the inventory cache may keep."""
    stripped = copy.deepcopy(dict(instance))
    credentials = stripped.get("sshCred")
    if isinstance(credentials, dict):
        credentials.pop("password", None)
    elif credentials is not None:
        stripped.pop("sshCred")
    return stripped


def inventory_hosts(instances: Iterable[Mapping[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
    """(host name, host vars) of each instance, in rank order. An instance without SSH access, or two instances
    under one host name, fail the whole listing: a partial inventory would silently run on fewer nodes."""
    hosts = []  # type: List[Tuple[str, Dict[str, Any]]]
    owners = {}  # type: Dict[str, str]
    for instance in rank_order(instances):
        name = host_name(instance)
        if name in owners:
            raise GlowsError("%s and instance %s both give the host name %s: filter one out with meta_key_prefix, "
                             "remark or regions" % (_label(instance), owners[name], name))
        owners[name] = _text(instance.get("instanceID")) or "?"
        hosts.append((name, instance_hostvars(instance)))
    return hosts
