"""MLflow: target and drafter versions, lineage tags and aliases."""
