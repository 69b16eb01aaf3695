"""serve.yml: the ring as a server, supervised from rank 0's node."""
