import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for sub in ("plugins", "plugins/filter", "plugins/module_utils", "roles/models/files", "plugins/action"):
    path = os.path.join(REPO, sub)
    if path not in sys.path:
        sys.path.insert(0, path)
