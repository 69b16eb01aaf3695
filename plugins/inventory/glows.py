"""Inventory plugin: the Glows instances of an account, as the hosts of group `cluster` in rank order.

Thin: the API is plugins/plugin_utils/glows/api.py, the choice, order, names and variables of the hosts are pure
functions in plugins/plugin_utils/glows/inventory.py.
"""

DOCUMENTATION = r"""
name: glows
short_description: Glows GPU instances as the hosts of group cluster
description:
  - Lists the instances of a Glows account through the Glows SDK HTTP API (v1) and adds those that pass the
    filters (I(statuses), I(meta_key_prefix), I(remark), I(regions)) to group C(cluster), in rank order (metaKey in
    natural order (C(x-2) before C(x-10)), then creation time, then instance id). The roles rank the hosts of
    C(cluster) by that order (a host's C(rank) variable overrides it only when every host has one).
  - Each host is named after its metaKey (the C(custom_meta_key) given at creation) when that is a valid host name,
    else after its instance id, and reached at its SSH access (C(ssh://host:port)).
  - "Host variables: C(ansible_host), C(ansible_port), C(ansible_user), C(gpu_name), C(gpu_mem) (the node's VRAM in
    GiB, the total over its GPUs), C(glows_gpu_count), C(glows_cpu_cores), C(glows_ram_gib), C(glows_disk_gib),
    C(glows_price_cent) (US cents per hour, a guess on the unit), C(glows_region), C(glows_image),
    C(glows_instance_id), C(glows_meta_key), C(glows_remark), C(glows_status), C(glows_created) (epoch seconds)
    and C(glows_api_url); then I(compose), I(groups) and I(keyed_groups) apply."
  - The root password Glows gives each instance never becomes a variable and is stripped before the cache; the
    first contact reads it from the API with the lookup M(prima.cluster.glows_ssh_password) (playbooks/glows-keys.yml).
  - A selected instance without an SSH access yet (still queued) fails the whole inventory with one line naming it,
    since a partial list would run the cluster on fewer nodes without a word.
  - The file must end in C(glows.yml) or C(glows.yaml).
  - What the Glows docs leave open (the list call's path and keys, the error codes, the price's unit) is listed
    under GUESSES at the top of plugins/plugin_utils/glows/api.py.
options:
  plugin:
    description: The name of this plugin; C(prima.cluster.glows) marks the file as its configuration.
    required: true
    type: str
    choices: [prima.cluster.glows]
  api_url:
    description: Base URL of the Glows SDK API.
    type: str
    default: https://a.glows.ai/sdk/v1
    env:
      - name: GLOWS_API_URL
  token:
    description:
      - The Glows SDK token (Authorization Bearer). Give it in the environment, or here as a C(!vault) string
        (and run with C(--ask-vault-pass)); never in clear in a file.
      - Required; without it the inventory fails with one line saying where to set it.
    type: str
    env:
      - name: GLOWS_SDK_TOKEN
  statuses:
    description: Instances whose status is one of these, as the API spells it; an empty list takes every status.
    type: list
    elements: str
    default: [Running]
  meta_key_prefix:
    description:
      - Only instances whose metaKey starts with this, a plain "starts with" test (C(bench-) takes C(bench-0) and
        C(bench-x-1-0) alike). Empty takes every metaKey.
      - When empty and I(rental_file) exists, the rental recorded there is used instead, with its exact keys.
    type: str
    default: ""
    env:
      - name: GLOWS_META_KEY_PREFIX
  remark:
    description: Only instances whose remark is exactly this. Empty takes every remark.
    type: str
    default: ""
  regions:
    description: Only instances in these regions (like C(TW-03)). Empty takes every region.
    type: list
    elements: str
    default: []
  rental_file:
    description:
      - The JSON record the rent playbook writes, an object with the rental's C(prefix). When it exists and
        I(meta_key_prefix) is empty, only the instances of that rental are listed, those whose metaKey is exactly
        C(<prefix>-<index>) (the keys its release cancels), so rental C(x-a) does not take C(x-a-1-0) of rental
        C(x-a-1). A file that is not such a record is an error. Set it to an empty string to ignore any rental.
    type: str
    default: ~/.config/prima-cluster/glows-rental.json
    env:
      - name: GLOWS_RENTAL_FILE
  retries:
    description: Retries of a call the API rate-limits (HTTP 429), with exponential backoff.
    type: int
    default: 5
  backoff_s:
    description: The first backoff in seconds; it doubles at each retry.
    type: float
    default: 1.0
  timeout_s:
    description: Seconds one call of the API may take in all, connecting and reading the whole answer (not each read).
    type: float
    default: 30.0
extends_documentation_fragment:
  - ansible.builtin.constructed
  - ansible.builtin.inventory_cache
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
# inventory/glows.glows.yml: every Running instance of the account whose metaKey starts with bench-7f3a-.
#   GLOWS_SDK_TOKEN=... ansible-inventory -i inventory/glows.glows.yml --graph
plugin: prima.cluster.glows
meta_key_prefix: bench-7f3a-
regions: [TW-03]
---
# The instances of the last rental (the prefix in its record), cached for ten minutes, with a group per GPU model.
plugin: prima.cluster.glows
rental_file: ~/.config/prima-cluster/glows-rental.json
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/prima-cluster/glows-inventory
cache_timeout: 600
keyed_groups:
  - key: gpu_name
    prefix: gpu
compose:
  # Leave 2 GiB of each card to the CUDA context instead of handing prima.cpp all of it.
  gpu_mem: gpu_mem - 2
"""

import hashlib
import json
import os
import time
from typing import Dict, Tuple

from ansible.errors import AnsibleParserError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible.utils.unsafe_proxy import wrap_var

from ansible_collections.prima.cluster.plugins.plugin_utils.glows import inventory as glows_inventory
from ansible_collections.prima.cluster.plugins.plugin_utils.glows.api import GlowsClient, GlowsError
from ansible_collections.prima.cluster.plugins.plugin_utils.glows.rental import key_index
from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.extra_vars import this_command_line_problems

GROUP = "cluster"
# Ansible tries a source with every enabled plugin until one parses it, and this plugin is reached twice (through
# `auto` and by name): a failure is remembered this long, so a refused token or a rate limit is not met twice.
FAILURE_MEMORY_S = 30.0
_FAILURES = {}  # type: Dict[Tuple[str, float], Tuple[float, str]]


def read_rental_prefix(path: str) -> str:
    """The prefix of the rental record at path; "" when there is no file. A file that is not a record is an error:
    silently listing every instance of the account instead would be worse."""
    if not path:
        return ""
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        return ""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        raise AnsibleParserError("the Glows rental file %s cannot be read as JSON (%s): fix or remove it, or set "
                                 "meta_key_prefix" % (path, " ".join(str(error).split())))
    prefix = record.get("prefix") if isinstance(record, dict) else None
    if not isinstance(prefix, str) or not prefix:
        raise AnsibleParserError("the Glows rental file %s has no \"prefix\": fix or remove it, or set meta_key_prefix"
                                 % path)
    return prefix


def token_digest(token: str) -> str:
    """Which account a cached listing belongs to, without the token: a digest with a purpose of its own, cut short."""
    return hashlib.sha256(b"prima.cluster.glows inventory cache\0" + token.encode("utf-8")).hexdigest()[:16]


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "prima.cluster.glows"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("glows.yml", "glows.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        try:
            # The config's mtime is in the key: an edited file is tried afresh.
            memory = (os.path.abspath(path), os.stat(path).st_mtime)
        except OSError:
            memory = (os.path.abspath(path), 0.0)
        failed = _FAILURES.get(memory)
        if failed and time.monotonic() - failed[0] < FAILURE_MEMORY_S:
            raise AnsibleParserError(failed[1])
        try:
            self._parse(path, cache)
        except AnsibleParserError as error:
            _FAILURES[memory] = (time.monotonic(), str(error))
            raise

    def _parse(self, path, cache):
        # A command line whose -e values would be lost or misread stops here, before any call of the API.
        problems = this_command_line_problems(self.loader)
        if problems:
            raise AnsibleParserError("\n".join(problems))
        self._read_config_data(path)
        api_url = str(self.get_option("api_url") or "").strip()
        token = self.get_option("token")
        token = to_text(token).strip() if token is not None else ""
        if not token:
            raise AnsibleParserError("the Glows inventory %s has no token: set GLOWS_SDK_TOKEN, or token: as a !vault "
                                     "string in that file" % path)
        # The whole account's listing is cached, keyed by the API and the account too (another token must not get
        # this one's listing), so other filters reuse it. Of the token only a digest: the key names a cache file.
        cache_key = "%s_%s_%s" % (self.get_cache_key(path), hashlib.sha256(api_url.encode()).hexdigest()[:8],
                                  token_digest(token))
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        instances = None
        if use_cache:
            try:
                instances = self._cache[cache_key]
            except KeyError:
                update_cache = True
        try:
            if instances is None:
                client = GlowsClient(api_url, token, retries=self.get_option("retries"),
                                     backoff_s=self.get_option("backoff_s"), timeout_s=self.get_option("timeout_s"))
                # The password is dropped at once: not even the cache may hold it.
                instances = [glows_inventory.without_password(instance) for instance in client.list_all()]
            if update_cache:
                self._cache[cache_key] = instances
            prefix = self.get_option("meta_key_prefix") or ""
            rental = "" if prefix else read_rental_prefix(self.get_option("rental_file") or "")
            chosen = glows_inventory.select(instances, statuses=self.get_option("statuses") or [],
                                            meta_key_prefix=prefix, remark=self.get_option("remark") or "",
                                            regions=self.get_option("regions") or [])
            if rental:
                # Exactly the keys release cancels (<prefix>-<index>): a "starts with" test would take rental
                # "x-1"'s node x-1-0 into rental "x", a node that x's release never cancels.
                chosen = [instance for instance in chosen if key_index(rental, instance.get("metaKey")) is not None]
            hosts = glows_inventory.inventory_hosts(chosen)
        except GlowsError as error:
            raise AnsibleParserError("%s (inventory %s)" % (error, path))
        self._populate(hosts, api_url)

    def _populate(self, hosts, api_url):
        self.inventory.add_group(GROUP)
        strict = self.get_option("strict")
        for name, variables in hosts:
            # Added in rank order: the roles rank the hosts of `cluster` by their order in the group.
            self.inventory.add_host(name, group=GROUP)
            # Unsafe: every string here comes from the API (a remark is anyone's text), and a host variable holding
            # "{{ ... }}" must stay text, never be templated (as community.general's inventory plugins do).
            variables = wrap_var(dict(variables, glows_api_url=api_url))
            for key, value in variables.items():
                self.inventory.set_variable(name, key, value)
            self._set_composite_vars(self.get_option("compose"), variables, name, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), variables, name, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), variables, name, strict=strict)
