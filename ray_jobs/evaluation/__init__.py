"""Evaluation library: scorers (a model or a lexical baseline), one module per benchmark (sts,
retrieval, nli, cqa), plots, the Figure-8 curve and the harness that runs them all."""
