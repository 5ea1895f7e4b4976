"""MLflow: runs by id, the model card, the pyfunc model, provenance."""
