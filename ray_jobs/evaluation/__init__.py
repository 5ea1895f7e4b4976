"""Evaluators and metrics: scorers (a model or a lexical baseline), one module per benchmark (sts,
retrieval, nli, cqa), paired comparisons, plots and the Figure-8 curve. pipelines/evaluate.py runs
them all for one scorer."""

BASELINES = ("bow", "tfidf")  # the lexical scorers (scorers.LexicalScorer), by `convsts evaluate --baseline`
