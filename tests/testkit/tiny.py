"""Tiny run-config overrides shared by the tests that start real training jobs (dotted, as on the
command line): small vocabularies and a small DAN so that a job takes seconds; a sweep's trial runs."""

TINY_DAN = [
    "tokenizer.word_vocab_size=3000",
    "tokenizer.bigram_buckets=2000",
    "model.dan.embedding_dim=32",
    "model.dan.hidden_sizes=[32]",
    "model.dan.output_dim=24",
    "model.response_hidden=16",
    "model.nli_hidden=16",
    "trainer.stages=[{start_step: 0, batch_size: 32, lr: 0.001}]",
    # The local feed: a test whose guarantee is not the feed's skips the Ray Data pipeline's start-up;
    # the feed's own guarantees override it with trainer.feed=ray_data (docs/testing.md).
    "trainer.feed=local",
]

# A sweep's trials: the tiny DAN with Adam, a loss point every 2 steps, no STS-B evaluation during
# training, a small Reddit evaluation, no CQA.
TINY_SWEEP_MODEL = [
    *TINY_DAN,
    "trainer.optimizer=adam",
    "trainer.log_every=2",
    "trainer.eval_every=0",
    "eval.reddit_pairs=200",
    "data.cqa_test=''",
]

# A 4-step job that checkpoints twice.
TINY_TRAIN = ["trainer.steps=4", "trainer.log_every=2", "trainer.checkpoint_every=2", "trainer.eval_every=0", *TINY_DAN]

# How the session's sample_prepared is prepared: in shards of about 500 rows (14 Reddit and 20 SNLI
# train shards, as a real folder has many), so the runs on it read many shards at once and the
# cluster tests' bit-for-bit comparison of two runs covers the fixed order of the trainer's feed,
# streamed (Reddit) and materialized (SNLI). Not a setting a run checks against the folder.
SAMPLE_PREPARE = ["data.rows_per_shard=500"]

# Texts that `normalize` changes before tokenizing: URLs, character references (named, numeric,
# escaped twice), runs of spaces, emoji, and empty ones.
EXPORT_PROBES = [
    "see https://example.com/a?b=1&amp;c=2 and www.example.org for it",
    "fish &amp; chips &gt; salad &lt;3 &quot;ok&quot; it&#39;s &#x27;fine&#x27; &eacute;t&eacute; &amp;gt; no",
    "a\u200b zero&#x200B;width and&nbsp;no-break   spaces\t\tand\nlines",
    "emoji 😀🎉 and a cut one \ufffd here",
    # HTML5-only names, legacy names without ";", references that meet (&amp;semi; &amp&semi;)
    "done &check; &starf; &NotLessLess; &ampfoo &notin &notit; &amp;semi; &amp&semi; &lt&semi; &#38;lt; &#3939;",
    "",
    "   ",
]


def trial_runs(uri: str, experiment: str, parent) -> dict:
    """A sweep's trial runs in MLflow by their trial id."""
    from convsts.ray_jobs.tracking import runs as tracking

    return {r.data.tags["convsts.trial_id"]: r for r in tracking.child_runs(uri, experiment, parent)}
