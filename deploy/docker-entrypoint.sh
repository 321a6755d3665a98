#!/bin/sh
# Entry point of the draftsync images. In the compose stack the monitor store lives in the `draftsync`
# database of the stack's Postgres: its URL is built here from POSTGRES_PASSWORD (deploy/draftsync.env)
# unless DRAFTSYNC_MONITOR_DB_URL is set outright. Anywhere else (docker or kubernetes work pools) this
# changes nothing.
set -e
if [ -z "${DRAFTSYNC_MONITOR_DB_URL:-}" ] && [ -n "${POSTGRES_PASSWORD:-}" ]; then
    database_host="${POSTGRES_HOST:-postgres}"
    DRAFTSYNC_MONITOR_DB_URL="postgresql+psycopg://draftsync:${POSTGRES_PASSWORD}@${database_host}:5432/draftsync"
    export DRAFTSYNC_MONITOR_DB_URL
fi
exec "$@"
