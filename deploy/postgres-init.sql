-- One Postgres serves MLflow, Prefect and the draftsync monitor store, each in its own database.
CREATE DATABASE mlflow;
CREATE DATABASE prefect;
