"""Action: rent Glows instances under one prefix and wait until they run, or release them.

On the controller, through the SDK API (plugin_utils/glows/api.py); the decisions are pure functions in
plugin_utils/glows/rental.py. Documented in plugins/modules/glows_rental.py.
"""

import contextlib
import fcntl
import json
import os
import tempfile
import time
from typing import Any, Dict, List, Mapping

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.prima.cluster.plugins.plugin_utils.glows import rental as glows_rental
from ansible_collections.prima.cluster.plugins.plugin_utils.glows.api import (CODE_META_KEY_TAKEN, CODE_NOT_FOUND,
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


def read_rental_record(path: str) -> Dict[str, Any]:
    """The rental file's record; {} when there is none. One that cannot be read is an error: taking it for "no
    rental" would start a second rental, or release nothing, while the first one runs on."""
    if not path or not os.path.lexists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        raise AnsibleActionFail("the rental file %s cannot be read (%s); fix or remove it (the instances it named may "
                                "still run: see the Glows console)" % (path, error))
    if not isinstance(record, dict) or not isinstance(record.get("prefix"), str):
        raise AnsibleActionFail("the rental file %s is not a rental record (a JSON object with a prefix); fix or remove "
                                "it (the instances it named may still run: see the Glows console)" % path)
    return record


@contextlib.contextmanager
def rental_lock(path: str):
    """One rent or release of a rental at a time on this controller: two at once would each create, or one
    cancel what the other just reported as rented."""
    if not path:
        yield
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    handle = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise AnsibleActionFail("another glows-rent.yml or glows-release.yml of the rental file %s runs now (it "
                                    "holds %s.lock); wait for it to finish" % (path, path))
        yield
    finally:
        os.close(handle)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGS)
        problems = glows_rental.prefix_problems(args["prefix"])
        if problems:
            raise AnsibleActionFail(problems[0])
        client = GlowsClient(args["api_url"], args["token"], retries=args["retries"], backoff_s=args["backoff_s"])
        try:
            with rental_lock(args["rental_file"]):
                self._check_record(args)
                if args["state"] == "absent":
                    result.update(self._release(client, args))
                else:
                    result.update(self._rent(client, args))
        except GlowsError as error:
            raise AnsibleActionFail(str(error))
        except OSError as error:
            raise AnsibleActionFail("the rental file %s: %s; set GLOWS_RENTAL_FILE to a path this user may write"
                                    % (args["rental_file"], error))
        return result

    @staticmethod
    def _check_record(args: Dict[str, Any]) -> None:
        """The rental file's rental lives on one API: a run against another (another account, the public API
        instead of a test one) would find nothing, and a release would drop the record of instances still running."""
        record = read_rental_record(args["rental_file"])
        if args["state"] == "present" and record.get("prefix") not in (None, args["prefix"]):
            raise AnsibleActionFail("the rental file %s records another rental, prefix %s; release it first "
                                    "(playbooks/glows-release.yml), or rent this one with another GLOWS_RENTAL_FILE"
                                    % (args["rental_file"], record["prefix"]))
        if record.get("prefix") == args["prefix"] and record.get("api_url") not in (None, args["api_url"]):
            raise AnsibleActionFail("the rental file %s records prefix %s on the API %s, but this run talks to %s; set "
                                    "GLOWS_API_URL=%s (or use another GLOWS_RENTAL_FILE)"
                                    % (args["rental_file"], args["prefix"], record["api_url"], args["api_url"],
                                       record["api_url"]))

    # Renting

    def _rent(self, client: GlowsClient, args: Dict[str, Any]) -> Dict[str, Any]:
        prefix = args["prefix"]
        problems = glows_rental.request_problems(args)
        if problems:
            raise AnsibleActionFail("; ".join(problems))
        decided = glows_rental.plan(client.list_all(), prefix, args)
        if decided["problems"]:
            raise AnsibleActionFail("; ".join(decided["problems"]))
        keys = [glows_rental.rental_key(prefix, index) for index in range(args["count"])]
        if self._play_context.check_mode:
            return {"changed": bool(decided["create"]), "prefix": prefix, "created": decided["create"],
                    "instances": decided["existing"],
                    "msg": "would create %s" % (", ".join(decided["create"]) or "nothing")}
        # The record first: a rental file that cannot be written stops the run before anything costs money.
        self._record(args, client, keys, decided["existing"])
        created = []  # type: List[str]
        try:
            for key in decided["create"]:
                body = glows_rental.create_body(key, args, args["ports"])
                try:
                    instance = client.create(body)
                except GlowsError as error:
                    if error.code == CODE_META_KEY_TAKEN:
                        if client.find(key) is not None:
                            # This account's: another rent of the prefix made it meanwhile. Wait for it too,
                            # and never cancel it here.
                            display.display("glows: %s exists already (another rent of this prefix?); waiting "
                                            "for it too" % key)
                            continue
                        raise GlowsError("%s; the key %s belongs to another Glows account (keys are unique across "
                                         "Glows): choose another -e prefix" % (error, key))
                    if error.code is None:
                        # No answer from the API (a timeout, a dropped connection): the instance may exist.
                        created.append(key)
                    raise
                created.append(key)
                display.display("glows: created %s (%s), %s" % (key, instance.get("instanceID"),
                                                                instance.get("status")))
            self._record(args, client, keys)
            instances = self._wait_running(client, keys, args)
        except Exception as error:  # whatever failed, what this run created must not run on unrecorded
            cleaned = self._after_failure(client, args, created)
            self._settle_record(args, client)
            raise AnsibleActionFail("%s%s" % (error, cleaned))
        self._record(args, client, keys, instances)
        cents = glows_rental.hourly_cents(instances)
        return {"changed": bool(created), "prefix": prefix, "created": created,
                "instances": [glows_rental.public_view(instance) for instance in instances],
                "hourly_cents": cents,
                "msg": "%d instances under prefix %s are Running (%s created now); together %s"
                       % (len(instances), prefix, len(created),
                          "%s per hour" % glows_rental.dollars(cents) if cents is not None else "price unknown")}

    def _wait_running(self, client: GlowsClient, keys: List[str], args: Dict[str, Any]) -> List[Dict[str, Any]]:
        started = time.monotonic()
        last_line, last_shown = "", 0.0
        while True:
            mine = glows_rental.owned(client.list_all(), args["prefix"])
            waited = time.monotonic() - started
            state = glows_rental.progress(mine, keys, waited)
            if state["lost"]:
                raise AnsibleActionFail("%s disappeared while waiting for Running (cancelled from the console, or "
                                        "Glows released it)" % ", ".join(state["lost"]))
            if state["failed"]:
                raise AnsibleActionFail("%s will not run (%s); try another region or GPU"
                                        % (", ".join(state["failed"]), state["line"]))
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

    @staticmethod
    def _settle_record(args: Dict[str, Any], client: GlowsClient) -> None:
        """After a failed rent the record says what is left: nothing left, no record (the next rent may start
        afresh); else the instances that still run."""
        if not args["rental_file"]:
            return
        try:
            left = glows_rental.owned(client.list_all(), args["prefix"])
        except GlowsError:
            return  # the API is not answering: keep the record as it is, it may name instances still running
        if left:
            write_rental_file(args["rental_file"],
                              glows_rental.rental_record(args["prefix"], args["api_url"], args, left))
        elif read_rental_record(args["rental_file"]).get("prefix") == args["prefix"]:
            os.unlink(args["rental_file"])

    @staticmethod
    def _record(args: Dict[str, Any], client: GlowsClient, keys: List[str], instances: Any = None) -> None:
        if not args["rental_file"]:
            return
        if instances is None:
            instances = [instance for instance in glows_rental.owned(client.list_all(), args["prefix"])
                         if instance.get("metaKey") in keys]
        write_rental_file(args["rental_file"], glows_rental.rental_record(args["prefix"], args["api_url"], args,
                                                                          instances))

    # Releasing

    def _release(self, client: GlowsClient, args: Dict[str, Any]) -> Dict[str, Any]:
        prefix = args["prefix"]
        mine = glows_rental.owned(client.list_all(), prefix)
        spent = glows_rental.spent_text(mine) if mine else ""
        if self._play_context.check_mode:
            return {"changed": bool(mine), "prefix": prefix, "released": [i.get("metaKey") for i in mine],
                    "msg": "would release %s" % (", ".join(i.get("metaKey") for i in mine) or "nothing")}
        for instance in mine:
            try:
                self._cancel(client, instance, prefix)
            except GlowsError:
                # Gone between the listing and the cancel is what release wants; anything else stays an error.
                if client.find(instance["metaKey"]) is not None:
                    raise
            display.display("glows: cancelled %s (%s)" % (instance.get("metaKey"), instance.get("instanceID")))
        started = time.monotonic()
        while True:
            left = glows_rental.owned(client.list_all(), prefix)
            if not left:
                break
            if time.monotonic() - started > args["wait_timeout_s"]:
                raise AnsibleActionFail("still listed after cancelling: %s; check the Glows console"
                                        % ", ".join(str(i.get("metaKey")) for i in left))
            time.sleep(max(0.1, args["poll_s"]))
        if args["rental_file"] and read_rental_record(args["rental_file"]).get("prefix") == prefix:
            os.unlink(args["rental_file"])
        return {"changed": bool(mine), "prefix": prefix, "released": [i.get("metaKey") for i in mine],
                "msg": ("released %d instances under prefix %s; they cost %s" % (len(mine), prefix, spent)) if mine
                else "nothing to release under prefix %s" % prefix}

    @staticmethod
    def _cancel(client: GlowsClient, instance: Mapping[str, Any], prefix: str) -> None:
        """Cancel one listed instance of the rental. By its id only once a query of that id says it carries the
        rental's key: the listing's pairing of key and id is not trusted with someone else's instance."""
        instance_id = instance.get("instanceID")
        if not isinstance(instance_id, str) or not instance_id:
            client.cancel(meta_key=instance["metaKey"])
            return
        problem = glows_rental.cancel_problem(instance, client.query(request_id=instance_id), prefix)
        if problem:
            raise AnsibleActionFail(problem)
        client.cancel(request_id=instance_id)
