"""Pipelines: a command's work end to end, each a function of a run config and an --out folder."""
