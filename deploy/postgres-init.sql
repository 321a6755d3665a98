-- One Postgres serves MLflow, Prefect and the draftsync monitor store, each in its own database.
-- The postgres image runs this once, on an empty data volume, through psql. \gexec creates only the
-- databases that are missing, so running it again (or with POSTGRES_DB=draftsync) is harmless.
SELECT format('CREATE DATABASE %I', name)
FROM unnest(ARRAY['mlflow', 'prefect', 'draftsync']) AS name
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = name)
\gexec
