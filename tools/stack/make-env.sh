#!/bin/sh
# Writes the compose stack's secret env files into DIR (default: deploy), each service's own, with fresh random
# secrets: postgres.env, mlflow.env, prefect.env, draftsync.env, webhook.env, serving.env (what goes in each:
# deploy/*.env.example). A file that exists is kept, so a rerun never changes a password Postgres already has.
# Usage: tools/stack/make-env.sh [DIR]     (`make test-stack` writes its own into a temporary folder)
set -eu
dir="${1:-$(dirname "$0")/../../deploy}"
mkdir -p "$dir"
umask 077
secret() { python3 -c "import secrets; print(secrets.token_hex(24))"; }
key() { python3 -c "import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())"; }

write() {  # NAME: the file's lines come on stdin
    if [ -e "$dir/$1" ]; then
        echo "$dir/$1: kept"
        cat > /dev/null
    else
        cat > "$dir/$1"
        echo "$dir/$1: written"
    fi
}

postgres_password="$(secret)"
mlflow_password="$(secret)"
prefect_password="$(secret)"
if [ -e "$dir/postgres.env" ]; then  # keep the URLs of new files in step with the password Postgres has
    postgres_password="$(sed -n 's/^POSTGRES_PASSWORD=//p' "$dir/postgres.env")"
fi
if [ -e "$dir/mlflow.env" ]; then
    mlflow_password="$(sed -n 's/^MLFLOW_AUTH_ADMIN_PASSWORD=//p' "$dir/mlflow.env")"
fi
if [ -e "$dir/prefect.env" ]; then
    prefect_password="$(sed -n 's/^PREFECT_SERVER_API_AUTH_STRING=[^:]*://p' "$dir/prefect.env")"
fi

write postgres.env <<END
POSTGRES_PASSWORD=$postgres_password
END
write mlflow.env <<END
MLFLOW_BACKEND_STORE_URI=postgresql://draftsync:$postgres_password@postgres:5432/mlflow
MLFLOW_AUTH_ADMIN_PASSWORD=$mlflow_password
MLFLOW_FLASK_SERVER_SECRET_KEY=$(secret)
MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY=$(key)
END
write prefect.env <<END
PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://draftsync:$postgres_password@postgres:5432/prefect
PREFECT_SERVER_API_AUTH_STRING=admin:$prefect_password
END
write draftsync.env <<END
MLFLOW_TRACKING_USERNAME=admin
MLFLOW_TRACKING_PASSWORD=$mlflow_password
PREFECT_API_AUTH_STRING=admin:$prefect_password
DRAFTSYNC_MONITOR_DB_URL=postgresql+psycopg://draftsync:$postgres_password@postgres:5432/draftsync
END
write webhook.env <<END
DRAFTSYNC_WEBHOOK_SECRET=$(secret)
END
write serving.env <<END
DRAFTSYNC_SERVING_TOKEN=$(secret)
END
