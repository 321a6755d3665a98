# MLflow tracking server with the Postgres driver its official image lacks (psycopg2 for postgresql:// URIs).
FROM ghcr.io/mlflow/mlflow:v3.17.2
RUN pip install --no-cache-dir psycopg2-binary==2.9.10
