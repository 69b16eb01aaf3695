import pytest

from ansible_collections.prima.cluster.plugins.module_utils.sandbox_node import (SandboxError, host_veth_name,
                                                                                 mounts_under, netns_name,
                                                                                 pids_rooted_in, unescape_mount_path)

MOUNTINFO = """22 1 0:21 / / rw,relatime - overlay overlay rw
40 22 0:5 / /var/lib/prima-sandbox/nodes/n0/root/proc rw - proc proc rw
41 22 0:20 / /var/lib/prima-sandbox/nodes/n0/root/dev rw - devtmpfs udev rw
42 41 0:22 / /var/lib/prima-sandbox/nodes/n0/root/dev/pts rw - devpts devpts rw
43 22 0:30 / /var/lib/prima-sandbox/nodes/n00/root/proc rw - proc proc rw
44 22 0:31 /cache /var/lib/prima-sandbox/nodes/n0/root/var/cache/my\\040cache rw - ext4 /dev/vda rw
"""


def test_mounts_under_deepest_first_and_only_that_root():
    assert mounts_under(MOUNTINFO, "/var/lib/prima-sandbox/nodes/n0/root/") == [
        "/var/lib/prima-sandbox/nodes/n0/root/var/cache/my cache",
        "/var/lib/prima-sandbox/nodes/n0/root/dev/pts",
        "/var/lib/prima-sandbox/nodes/n0/root/dev",
        "/var/lib/prima-sandbox/nodes/n0/root/proc",
    ]


def test_mounts_under_does_not_match_a_sibling_prefix():
    assert mounts_under(MOUNTINFO, "/var/lib/prima-sandbox/nodes/n00") == [
        "/var/lib/prima-sandbox/nodes/n00/root/proc"]


def test_unescape_mount_path():
    assert unescape_mount_path("/a\\040b\\011c\\134d") == "/a b\tc\\d"


def test_pids_rooted_in():
    roots = {1: "/", 10: "/srv/nodes/n0/root", 11: "/srv/nodes/n0/root/opt", 12: "/srv/nodes/n01/root"}
    assert pids_rooted_in(roots, "/srv/nodes/n0/root") == [10, 11]


def test_names():
    assert netns_name("n0") == "psb-n0"
    assert host_veth_name("n0") == "psbh-n0"
    with pytest.raises(SandboxError, match="too long for an interface name"):
        host_veth_name("a-very-long-node")
