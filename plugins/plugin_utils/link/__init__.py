"""Shaping a node's cluster link for the link sweeps."""
