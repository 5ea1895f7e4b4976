"""Processes and clusters: entry-point set-up (Ray, MLflow, signals), resources and placement, the job API, the --out lock."""
