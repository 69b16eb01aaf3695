"""Checks before a playbook touches anything: the inventory, role inputs, and the -e values as typed."""
