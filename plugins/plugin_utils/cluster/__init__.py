"""What concerns the cluster as a whole: its lock, the readiness suite's pieces, the collection's own paths."""
