"""Fast tests of the code alone: no servers, no MLflow, Prefect or Postgres, no subprocesses, no training beyond a few
milliseconds. The folders mirror draftsync/; `make test-unit` runs them in under a minute."""
