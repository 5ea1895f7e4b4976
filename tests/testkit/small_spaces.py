"""Tune spaces for tests (`convsts tune --space testkit.small_spaces:NAME`, with tests/ on the path)."""

import dataclasses

from convsts.tune_spaces.sts_matrix import SPACE

# The STS matrix space with ASHA's max_t at 6 epochs: a trial of 6 epochs runs to max_t (and is
# stopped there by ASHA as its end); ASHA stops the others at its rungs 1 and 3.
STS_MATRIX_MAX_T_6 = dataclasses.replace(SPACE, max_t=6)
