"""Prepared inputs: a task's prepared folder and manifest, a run's inputs, hard negatives."""
