"""How cross-node connections travel: direct, or through SSH port forwards."""
