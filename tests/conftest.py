"""Every test imports the collection's Python by its full name (ansible_collections.prima.cluster...), through
Ansible's own collection loader, set up here before any test module is imported: the checkout is the collection,
linked in as .collections/ansible_collections/prima/cluster (the collections path ansible.cfg names)."""

import os

from ansible.plugins.loader import init_plugin_loader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))
init_plugin_loader([os.path.join(REPO, ".collections")])
