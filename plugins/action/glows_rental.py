"""Action: rent Glows instances under one prefix and wait until they run, or release them.

On the controller, through the SDK API (plugin_utils/glowsapi.py); the decisions are pure functions in
plugin_utils/glowsrent.py. Documented in plugins/modules/glows_rental.py.
"""

import json
import os
import tempfile
import time
from typing import Any, Dict, List, Mapping

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.prima.cluster.plugins.plugin_utils import glowsrent
from ansible_collections.prima.cluster.plugins.plugin_utils.glowsapi import (CODE_META_KEY_TAKEN, CODE_NOT_FOUND,
                                                                             GlowsClient, GlowsError)

display = Display()

ARGS = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "api_url": {"type": "str", "required": True},
    "token": {"type": "str", "required": True, "no_log": True},
    "prefix": {"type": "str", "required": True},
    "count": {"type": "int"},
    "gpu_name": {"type": "str", "default": ""},
    "region_name": {"type": "str", "default": ""},
    "image_id": {"type": "str", "default": ""},
    "snapshot_id": {"type": "str", "default": ""},
    "instance_category": {"type": "str", "default": "container"},
    "remark": {"type": "str", "default": ""},
    "ports": {"type": "list", "elements": "dict", "default": []},
    "rental_file": {"type": "path", "default": ""},
    "wait_timeout_s": {"type": "int", "default": 1800},
    "poll_s": {"type": "float", "default": 10.0},
    "keep_on_failure": {"type": "bool", "default": False},
    "retries": {"type": "int", "default": 5},
    "backoff_s": {"type": "float", "default": 1.0},
}


def write_rental_file(path: str, record: Mapping[str, Any]) -> None:
    """Atomically, readable by its owner only: it names instances that cost money."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".glows-rental.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(record, stream, indent=2, sort_keys=True)
            stream.write("\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def read_rental_prefix(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return ""
    return record.get("prefix", "") if isinstance(record, dict) else ""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGS)
        problems = glowsrent.prefix_problems(args["prefix"])
        if problems:
            raise AnsibleActionFail(problems[0])
        client = GlowsClient(args["api_url"], args["token"], retries=args["retries"], backoff_s=args["backoff_s"])
        try:
            if args["state"] == "absent":
                result.update(self._release(client, args))
            else:
                result.update(self._rent(client, args))
        except GlowsError as error:
            raise AnsibleActionFail(str(error))
        return result

    # Renting

    def _rent(self, client: GlowsClient, args: Dict[str, Any]) -> Dict[str, Any]:
        prefix = args["prefix"]
        problems = glowsrent.request_problems(args)
        if problems:
            raise AnsibleActionFail("; ".join(problems))
        decided = glowsrent.plan(client.list_all(), prefix, args)
        if decided["problems"]:
            raise AnsibleActionFail("; ".join(decided["problems"]))
        keys = [glowsrent.rental_key(prefix, index) for index in range(args["count"])]
        if self._play_context.check_mode:
            return {"changed": bool(decided["create"]), "prefix": prefix, "created": decided["create"],
                    "instances": decided["existing"],
                    "msg": "would create %s" % (", ".join(decided["create"]) or "nothing")}
        created = []  # type: List[str]
        try:
            for key in decided["create"]:
                body = glowsrent.create_body(key, args, args["ports"])
                try:
                    instance = client.create(body)
                except GlowsError as error:
                    if error.code == CODE_META_KEY_TAKEN:
                        raise GlowsError("%s; the key %s is taken, by another rent of this prefix running now or "
                                         "by another Glows account: choose another -e prefix" % (error, key))
                    if error.code is None:
                        # No answer from the API (a timeout, a dropped connection): the instance may exist.
                        created.append(key)
                    raise
                created.append(key)
                display.display("glows: created %s (%s), %s" % (key, instance.get("instanceID"),
                                                                instance.get("status")))
            self._record(args, client, keys)
            instances = self._wait_running(client, keys, args)
        except (GlowsError, AnsibleActionFail) as error:
            raise AnsibleActionFail("%s%s" % (error, self._after_failure(client, args, created)))
        self._record(args, client, keys, instances)
        cents = glowsrent.hourly_cents(instances)
        return {"changed": bool(created), "prefix": prefix, "created": created,
                "instances": [glowsrent.public_view(instance) for instance in instances],
                "hourly_cents": cents,
                "msg": "%d instances under prefix %s are Running (%s created now); together %s"
                       % (len(instances), prefix, len(created),
                          "%s per hour" % glowsrent.dollars(cents) if cents is not None else "price unknown")}

    def _wait_running(self, client: GlowsClient, keys: List[str], args: Dict[str, Any]) -> List[Dict[str, Any]]:
        started = time.monotonic()
        last_line, last_shown = "", 0.0
        while True:
            mine = glowsrent.owned(client.list_all(), args["prefix"])
            waited = time.monotonic() - started
            state = glowsrent.progress(mine, keys, waited)
            if state["lost"]:
                raise AnsibleActionFail("%s disappeared while waiting for Running (cancelled from the console, or "
                                        "Glows released it)" % ", ".join(state["lost"]))
            if state["ready"]:
                display.display("glows: " + state["line"])
                return [dict(instance) for instance in mine if instance.get("metaKey") in keys]
            if waited >= args["wait_timeout_s"]:
                raise AnsibleActionFail("not every instance was Running after %d s (%s); raise -e wait_timeout_s, "
                                        "or try another region or GPU" % (waited, state["line"]))
            # A line when something changed, else once a minute: scheduling can take long.
            changed_state = state["line"].split(": ", 1)[-1] != last_line
            if changed_state or waited - last_shown >= 60:
                display.display("glows: " + state["line"])
                last_line, last_shown = state["line"].split(": ", 1)[-1], waited
            time.sleep(max(0.1, args["poll_s"]))

    def _after_failure(self, client: GlowsClient, args: Dict[str, Any], created: List[str]) -> str:
        """A failed rent releases what this run created, unless told to keep it."""
        if not created:
            return ""
        if args["keep_on_failure"]:
            return ("; kept the %d instances this run created (%s), which cost money until released: "
                    "playbooks/glows-release.yml -e prefix=%s" % (len(created), ", ".join(created), args["prefix"]))
        released, failed = [], []
        for key in created:
            try:
                client.cancel(meta_key=key)
                released.append(key)
            except GlowsError as error:
                if error.code != CODE_NOT_FOUND:
                    failed.append("%s (%s)" % (key, error))
        text = "; released the instances this run created (%s)" % (", ".join(released) or "none")
        if failed:
            text += "; COULD NOT release %s: run playbooks/glows-release.yml -e prefix=%s" % (
                ", ".join(failed), args["prefix"])
        else:
            text += " (keep them next time with -e keep_on_failure=true)"
        return text

    def _record(self, args: Dict[str, Any], client: GlowsClient, keys: List[str],
                instances: Any = None) -> None:
        if not args["rental_file"]:
            return
        if instances is None:
            instances = [instance for instance in glowsrent.owned(client.list_all(), args["prefix"])
                         if instance.get("metaKey") in keys]
        write_rental_file(args["rental_file"], glowsrent.rental_record(args["prefix"], args["api_url"], args,
                                                                       instances))

    # Releasing

    def _release(self, client: GlowsClient, args: Dict[str, Any]) -> Dict[str, Any]:
        prefix = args["prefix"]
        mine = glowsrent.owned(client.list_all(), prefix)
        spent = glowsrent.spent_text(mine) if mine else ""
        if self._play_context.check_mode:
            return {"changed": bool(mine), "prefix": prefix, "released": [i.get("metaKey") for i in mine],
                    "msg": "would release %s" % (", ".join(i.get("metaKey") for i in mine) or "nothing")}
        for instance in mine:
            try:
                client.cancel(request_id=instance["instanceID"])
            except GlowsError:
                # Gone between the listing and the cancel is what release wants; anything else stays an error.
                if client.find(instance["metaKey"]) is not None:
                    raise
            display.display("glows: cancelled %s (%s)" % (instance.get("metaKey"), instance.get("instanceID")))
        started = time.monotonic()
        while True:
            left = glowsrent.owned(client.list_all(), prefix)
            if not left:
                break
            if time.monotonic() - started > args["wait_timeout_s"]:
                raise AnsibleActionFail("still listed after cancelling: %s; check the Glows console"
                                        % ", ".join(str(i.get("metaKey")) for i in left))
            time.sleep(max(0.1, args["poll_s"]))
        if args["rental_file"] and read_rental_prefix(args["rental_file"]) == prefix:
            os.unlink(args["rental_file"])
        return {"changed": bool(mine), "prefix": prefix, "released": [i.get("metaKey") for i in mine],
                "msg": ("released %d instances under prefix %s; they cost %s" % (len(mine), prefix, spent)) if mine
                else "nothing to release under prefix %s" % prefix}
