"""Where the collection's own files are, wherever it is installed or checked out."""

import os

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES_DIR = os.path.join(COLLECTION_ROOT, "templates")


def collection_path(relative: str) -> str:
    """`relative` (like 'templates/launch') under the collection's root; ValueError when it leaves the root."""
    path = os.path.normpath(os.path.join(COLLECTION_ROOT, relative))
    if os.path.isabs(relative) or not (path == COLLECTION_ROOT or path.startswith(COLLECTION_ROOT + os.sep)):
        raise ValueError("%r is not a path inside the collection" % relative)
    return path
