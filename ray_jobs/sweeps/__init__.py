"""Ray Tune sweeps over the spaces in tune_spaces/."""
