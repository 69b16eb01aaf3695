"""Renting and releasing Glows instances under one prefix: the decisions, as pure functions.

A rental is `count` instances whose custom_meta_key is `<prefix>-<index>`, index 0 .. count-1. The
prefix is the rental's identity: a re-run with the same prefix creates only what is missing, and a
release cancels exactly the instances whose key is `<prefix>-<digits>`, nothing else. custom_meta_key
is unique across all of Glows, so a new prefix carries a random part.
"""

import json
import re
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

# custom_meta_key is at most 64 characters (API docs); the prefix leaves room for "-<index>".
PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
PREFIX_MAX = 48
MAX_COUNT = 64
READY = "Running"
PENDING = ("SchedQueued",)
# Only SchedQueued and Running are documented. A status that says the instance will not come is taken as final
# at once (a guess, as the words are); any other unknown status is waited on, named in the progress line.
FINAL_STATUS = re.compile(r"fail|error|stop|cancel|releas|terminat|delet|expire", re.IGNORECASE)
SSH_PROTOCOL = 1  # ports[].protocol: 1 SSH, 2 HTTP (API docs)
HTTP_PROTOCOL = 2


def prefix_problems(prefix: Any) -> List[str]:
    if not isinstance(prefix, str) or not prefix:
        return ["the rental prefix is empty; give -e prefix=NAME (lower-case letters, digits and '-'), or rent first "
                "so the rental file names it"]
    if len(prefix) > PREFIX_MAX or not PREFIX_PATTERN.match(prefix):
        return ["the rental prefix %r is not lower-case letters, digits and single '-' (at most %d characters, "
                "starting with a letter); it names the instances as <prefix>-<index>, so choose another"
                % (prefix, PREFIX_MAX)]
    return []


def new_prefix(random_part: str) -> str:
    """A fresh prefix: custom_meta_key is unique across all of Glows, hence the random part."""
    return "prima-" + re.sub(r"[^a-z0-9]", "", random_part.lower())[:10]


def rental_key(prefix: str, index: int) -> str:
    return "%s-%d" % (prefix, index)


def key_index(prefix: str, meta_key: Any) -> Optional[int]:
    """The index of a key of this rental, None for any other key (another prefix, or more after the digits)."""
    if not isinstance(meta_key, str):
        return None
    match = re.fullmatch(re.escape(prefix) + r"-(0|[1-9][0-9]{0,3})", meta_key)
    return int(match.group(1)) if match else None


def owned(instances: Iterable[Mapping[str, Any]], prefix: str) -> List[Mapping[str, Any]]:
    """This rental's instances, by index."""
    mine = [instance for instance in instances if key_index(prefix, instance.get("metaKey")) is not None]
    return sorted(mine, key=lambda instance: key_index(prefix, instance.get("metaKey")) or 0)


def cancel_problem(listed: Mapping[str, Any], queried: Mapping[str, Any], prefix: str) -> Optional[str]:
    """Why the instance the listing shows must not be cancelled by its instanceID, None when it may. The listing
    pairs a key with an id; only a query of that id says whose it is, and a cancel by id takes whatever it names."""
    key, instance_id = listed.get("metaKey"), listed.get("instanceID")
    if key_index(prefix, key) is None:
        return "%s is not a key of the rental %s; not cancelled" % (key, prefix)
    if queried.get("metaKey") != key:
        owner = queried.get("metaKey") or "an instance with no metaKey"
        return ("the listing pairs %s with instance %s, but the API says %s is %s; refused to cancel it (it is not "
                "this rental's): check the Glows console" % (key, instance_id, instance_id, owner))
    return None


def request_problems(request: Mapping[str, Any]) -> List[str]:
    """What rent needs before it may call the API: a count, a GPU, a region, and one image or snapshot."""
    problems = []
    count = request.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        problems.append("count is %r; give -e count=N, N from 1 to %d instances" % (count, MAX_COUNT))
    for name, flag in (("gpu_name", "gpu"), ("region_name", "region")):
        value = request.get(name)
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            problems.append("%s is empty; give -e %s=... as the Glows console names it (e.g. %s)"
                            % (name, flag, "'NVIDIA GeForce RTX 4090'" if flag == "gpu" else "TW-03"))
    image, snapshot = request.get("image_id") or "", request.get("snapshot_id") or ""
    if bool(image) == bool(snapshot):
        problems.append("give exactly one of -e image=IMAGE_ID and -e snapshot=SNAPSHOT_ID (now: image %r, "
                        "snapshot %r)" % (image, snapshot))
    if request.get("instance_category", "container") not in ("container", "vm"):
        problems.append("instance_category is %r; use container or vm" % request.get("instance_category"))
    return problems


def plan(instances: Sequence[Mapping[str, Any]], prefix: str, request: Mapping[str, Any]) -> Dict[str, Any]:
    """Which keys to create; problems when what exists under the prefix is not what is asked for."""
    mine = owned(instances, prefix)
    count = int(request["count"])
    have = {key_index(prefix, instance.get("metaKey")): instance for instance in mine}
    problems = []
    extra = sorted(index for index in have if index is not None and index >= count)
    if extra:
        problems.append("%d instances exist under prefix %s, more than count=%d (%s); give -e count=%d, or "
                        "release them with playbooks/glows-release.yml -e prefix=%s"
                        % (len(have), prefix, count, ", ".join(rental_key(prefix, index) for index in extra),
                           max(extra) + 1, prefix))
    for index, instance in sorted(have.items()):
        hardware = instance.get("hardware")
        gpu = hardware.get("gpuName") if isinstance(hardware, Mapping) else None
        if gpu and gpu != request["gpu_name"]:
            problems.append("%s (%s) is a %s, not the requested %s; release the rental or choose another prefix"
                            % (instance.get("metaKey"), instance.get("instanceID"), gpu, request["gpu_name"]))
    return {"create": [rental_key(prefix, index) for index in range(count) if index not in have],
            "existing": [dict(public_view(instance)) for instance in mine], "problems": problems}


def transport_ports(cluster_network: str, world: int, bases: Mapping[str, int]) -> List[Dict[str, int]]:
    """The ports an instance exports. SSH carries the cluster on Glows (cluster_network ssh or auto: its
    probe finds the direct path closed), so SSH alone; direct needs every port a rank listens on."""
    ports = [{"port": 22, "protocol": SSH_PROTOCOL}]
    if cluster_network != "direct":
        return ports
    listen = {int(bases["fanout"])}
    for rank in range(world):
        listen.update({int(bases["data"]) + rank, int(bases["signal"]) + rank})
        if rank:
            listen.add(int(bases["rpc"]) + rank - 1)
    return ports + [{"port": port, "protocol": HTTP_PROTOCOL} for port in sorted(listen)]


def create_body(key: str, request: Mapping[str, Any], ports: Sequence[Mapping[str, int]]) -> Dict[str, Any]:
    body = {"gpu_name": request["gpu_name"], "custom_meta_key": key, "region_name": request["region_name"],
            "instance_category": request.get("instance_category") or "container",
            "ports": json.dumps(list(ports), separators=(",", ":"))}
    if request.get("image_id"):
        body["from_image_id"] = request["image_id"]
    else:
        body["from_snap_id"] = request["snapshot_id"]
    if request.get("remark"):
        body["remark"] = request["remark"]
    return body


def public_view(instance: Mapping[str, Any]) -> Dict[str, Any]:
    """The instance as reported and recorded: its credentials left out."""
    view = {key: value for key, value in instance.items() if key != "sshCred"}
    if isinstance(instance.get("sshCred"), Mapping):
        view["sshCred"] = {"user": instance["sshCred"].get("user")}
    return view


def has_ssh_url(instance: Mapping[str, Any]) -> bool:
    accesses = instance.get("accesses")
    return isinstance(accesses, list) and any(
        isinstance(access, Mapping) and access.get("protocol") == "ssh" and access.get("url") for access in accesses)


def progress(instances: Sequence[Mapping[str, Any]], keys: Sequence[str], waited_s: float) -> Dict[str, Any]:
    """Where the rental stands: ready when every key is Running with its SSH access; lost keys are gone."""
    by_key = {instance.get("metaKey"): instance for instance in instances}
    states, lost, failed, ready = [], [], [], 0
    for key in keys:
        instance = by_key.get(key)
        if instance is None:
            lost.append(key)
            states.append("%s gone" % key)
            continue
        status = str(instance.get("status") or "?")
        if FINAL_STATUS.search(status):
            failed.append(key)
        if status == READY and has_ssh_url(instance):
            ready += 1
        elif status == READY:
            status = "Running, no SSH access yet"
        states.append("%s %s" % (key, status))
    return {"ready": ready == len(keys) and not lost, "lost": lost, "failed": failed,
            "line": "%d/%d Running after %d s: %s" % (ready, len(keys), waited_s, ", ".join(states))}


def hourly_cents(instances: Iterable[Mapping[str, Any]]) -> Optional[int]:
    """Together per hour, None when an instance has no price yet."""
    total = 0
    for instance in instances:
        price = instance.get("priceCent")
        if isinstance(price, bool) or not isinstance(price, int) or price <= 0:
            return None
        total += price
    return total


def dollars(cents: float) -> str:
    return "$%.2f" % (cents / 100.0)


def spent_text(instances: Sequence[Mapping[str, Any]], now: Optional[float] = None) -> str:
    """What the instances cost from their creation until now, at their price (the API's priceCent per hour)."""
    now = time.time() if now is None else now
    cents, unknown = 0.0, []
    for instance in instances:
        price = instance.get("priceCent")
        created_time = instance.get("createTime")
        created = created_time.get("seconds") if isinstance(created_time, Mapping) else None
        if (isinstance(price, bool) or not isinstance(price, int) or isinstance(created, bool)
                or not isinstance(created, (int, float))):
            unknown.append(str(instance.get("metaKey") or instance.get("instanceID")))
            continue
        cents += price * max(0.0, now - created) / 3600.0
    if unknown:
        return "unknown (no price or creation time for %s)" % ", ".join(unknown)
    return "about %s (%d instances since their creation)" % (dollars(cents), len(instances))


def rental_record(prefix: str, api_url: str, request: Mapping[str, Any], instances: Sequence[Mapping[str, Any]],
                  now: Optional[float] = None) -> Dict[str, Any]:
    """The rental file: what release and the inventory plugin need, no credentials."""
    return {"prefix": prefix, "api_url": api_url, "count": request.get("count"), "gpu_name": request.get("gpu_name"),
            "region_name": request.get("region_name"), "image_id": request.get("image_id") or None,
            "snapshot_id": request.get("snapshot_id") or None, "updated": int(time.time() if now is None else now),
            "instances": [{"meta_key": instance.get("metaKey"), "instance_id": instance.get("instanceID")}
                          for instance in instances]}
