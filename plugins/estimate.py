"""python3 plugins/estimate.py --gguf FILE [...]: what a split model costs on the wire and in memory.

A thin entry point: the estimator is plugins/plugin_utils/models/estimate.py (it needs the gguf library). It reads
the model's header with models/gguf_header.py, which it imports by the collection's full name, as Ansible does: so
the directory that holds ansible_collections/prima/cluster goes on the path first.
"""

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collections_dir(root: str) -> str:
    """The directory that holds ansible_collections/prima/cluster: a checkout's own link to itself
    (.collections/ansible_collections/prima/cluster), else the one an installed collection lies in."""
    linked = os.path.join(root, ".collections")
    if os.path.isdir(os.path.join(linked, "ansible_collections", "prima", "cluster")):
        return linked
    return os.path.dirname(os.path.dirname(os.path.dirname(root)))


if __name__ == "__main__":
    sys.path.insert(0, collections_dir(ROOT))
    runpy.run_module("ansible_collections.prima.cluster.plugins.plugin_utils.models.estimate", run_name="__main__",
                     alter_sys=True)
