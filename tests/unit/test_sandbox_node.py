import os
import subprocess

import pytest

from ansible_collections.prima.cluster.plugins.module_utils.sandbox_node import (SandboxError, copy_root,
                                                                                 host_veth_name, mounts_under,
                                                                                 netns_name, pids_rooted_in,
                                                                                 unescape_mount_path)

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


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_copy_root_copies_a_live_root_without_what_is_mounted_in_it(tmp_path):
    source, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (source / "etc").mkdir(parents=True)
    (source / "etc" / "hostname").write_text("n0\n")
    (source / "dev").mkdir()
    (source / "dev" / "null-stand-in").write_text("under the mount\n")
    (source / "a b").mkdir()
    elsewhere.mkdir()
    (elsewhere / "big").write_text("not the node's\n")
    mounts = [source / "dev", source / "a b"]
    for point in mounts:
        subprocess.run(["mount", "--bind", str(elsewhere), str(point)], check=True)
    try:
        copy_root(str(source), str(tmp_path / "copy"), str(tmp_path / "staging"))
    finally:
        for point in mounts:
            subprocess.run(["umount", str(point)], check=True)
    copy = tmp_path / "copy"
    assert (copy / "etc" / "hostname").read_text() == "n0\n"
    # What the mount hid is copied (a node's /dev from debootstrap), what was mounted is not.
    assert os.listdir(str(copy / "dev")) == ["null-stand-in"] and os.listdir(str(copy / "a b")) == []
    assert not (tmp_path / "staging").exists() and str(tmp_path) not in open("/proc/self/mountinfo").read()
    # Nothing mounted: a plain cp -a, as before.
    copy_root(str(source), str(tmp_path / "copy2"), str(tmp_path / "staging"))
    assert (tmp_path / "copy2" / "dev" / "null-stand-in").exists()
