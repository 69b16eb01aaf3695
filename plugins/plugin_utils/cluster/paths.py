"""Where the collection's own files are, wherever it is installed or checked out."""

import os

# This file is plugins/plugin_utils/cluster/paths.py: the root is four directories up.
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The report is the bench role's; plugin_utils/bench/report.py renders it.
REPORT_TEMPLATE = os.path.join(COLLECTION_ROOT, "roles", "bench", "templates", "report.md.j2")


def collection_path(relative: str) -> str:
    """`relative` (like 'roles/launch/templates') under the collection's root; ValueError when it leaves the root."""
    path = os.path.normpath(os.path.join(COLLECTION_ROOT, relative))
    if os.path.isabs(relative) or not (path == COLLECTION_ROOT or path.startswith(COLLECTION_ROOT + os.sep)):
        raise ValueError("%r is not a path inside the collection" % relative)
    return path
