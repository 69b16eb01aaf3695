# The action plugin plugins/action/glows_rental.py does the work, on the controller; this file documents it.

DOCUMENTATION = r"""
---
module: glows_rental
short_description: Rent Glows instances under one prefix and wait until they run, or release them
description:
  - Talks to the GLOWS SDK HTTP API from the controller (the client is plugins/plugin_utils/glows/api.py; what
    its documentation leaves open is listed there as GUESSES).
  - C(state=present) creates the instances C(<prefix>-0) .. C(<prefix>-<count-1>) that do not exist yet
    (custom_meta_key), then waits until each is C(Running) with its SSH access, printing progress. A re-run
    with the same prefix creates nothing. When creating or waiting fails, the instances this run created
    are cancelled, unless C(keep_on_failure).
  - C(state=absent) cancels exactly the instances whose key is C(<prefix>-<digits>), waits until the API no
    longer lists them, and says what they cost since their creation.
  - The rental file (JSON, mode 0600) records the prefix and the instances' ids, never a password; the
    inventory plugin C(prima.cluster.glows) reads the prefix from it.
options:
  state:
    description: present rents, absent releases.
    type: str
    choices: [present, absent]
    default: present
  api_url:
    description: Base URL of the SDK API.
    type: str
    required: true
  token:
    description: The SDK token (Authorization Bearer); never logged.
    type: str
    required: true
  prefix:
    description: The rental's prefix; instances are named C(<prefix>-<index>).
    type: str
    required: true
  count:
    description: How many instances (present).
    type: int
  gpu_name:
    description: GPU model as Glows names it.
    type: str
    default: ""
  region_name:
    description: Region, such as TW-03.
    type: str
    default: ""
  image_id:
    description: Base image id (from_image_id); exactly one of image_id and snapshot_id.
    type: str
    default: ""
  snapshot_id:
    description: Snapshot id (from_snap_id).
    type: str
    default: ""
  instance_category:
    description: container or vm.
    type: str
    default: container
  remark:
    description: The instances' remark.
    type: str
    default: ""
  ports:
    description: Ports to export, as the API's ports list (C(port), C(protocol) 1 SSH or 2 HTTP).
    type: list
    elements: dict
    default: []
  rental_file:
    description: Where the rental is recorded on the controller; empty for none.
    type: path
    default: ""
  wait_timeout_s:
    description: Seconds to wait for Running (present) or for the cancelled instances to go (absent).
    type: int
    default: 1800
  poll_s:
    description: Seconds between two listings while waiting.
    type: float
    default: 10
  keep_on_failure:
    description: Keep the instances this run created when it fails (they cost money until released).
    type: bool
    default: false
  retries:
    description: Tries of a rate-limited request (HTTP 429), with exponential backoff.
    type: int
    default: 5
  backoff_s:
    description: First backoff after a 429, in seconds.
    type: float
    default: 1
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Rent three RTX 4090 instances
  prima.cluster.glows_rental:
    api_url: https://a.glows.ai/sdk/v1
    token: "{{ lookup('ansible.builtin.env', 'GLOWS_SDK_TOKEN') }}"
    prefix: prima-x7k2m9pq
    count: 3
    gpu_name: NVIDIA GeForce RTX 4090
    region_name: TW-03
    image_id: img-87p9kq26
    ports: [{port: 22, protocol: 1}]
    rental_file: ~/.config/prima-cluster/glows-rental.json

- name: Release them
  prima.cluster.glows_rental:
    state: absent
    api_url: https://a.glows.ai/sdk/v1
    token: "{{ lookup('ansible.builtin.env', 'GLOWS_SDK_TOKEN') }}"
    prefix: prima-x7k2m9pq
"""

RETURN = r"""
prefix:
  description: The rental's prefix.
  returned: always
  type: str
created:
  description: Keys created by this run (present).
  returned: when state is present
  type: list
  elements: str
instances:
  description: The rental's instances as the API lists them, without credentials.
  returned: when state is present
  type: list
  elements: dict
hourly_cents:
  description: Their price together, US cents per hour; null when one has no price.
  returned: when state is present
  type: int
released:
  description: Keys cancelled (absent).
  returned: when state is absent
  type: list
  elements: str
"""
