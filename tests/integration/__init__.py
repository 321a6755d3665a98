"""Tests that need more than the code: MLflow, Prefect, Postgres, SMTP or HTTP servers, subprocesses, or training.
The folders mirror draftsync/; all of it runs in `make test`."""
