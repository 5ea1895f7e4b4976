"""convsts data pipelines (this top-level package is ours, not Hugging Face `datasets`)."""
