"""Shared I/O every layer imports: files and URIs, local caches, compressed streams, redaction, error types."""
