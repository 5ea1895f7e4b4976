"""The run config: its schema and defaults, loading and validation, its reference, flattened forms."""
