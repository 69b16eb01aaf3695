"""The models: the catalog, the GGUF header, and what a split model costs."""
