#!/bin/sh
# What the compose stack uses of the official postgres image's entrypoint: on an empty data directory, initdb
# with POSTGRES_USER and POSTGRES_PASSWORD (scram), create POSTGRES_DB, run /docker-entrypoint-initdb.d/*.sql
# through psql while the server listens on its socket only; then the server on all addresses.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
user="${POSTGRES_USER:-postgres}"
database="${POSTGRES_DB:-$user}"
as_postgres() { runuser -u postgres -- "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    password_file="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$password_file"
    chown postgres "$password_file"
    as_postgres initdb --username="$user" --pwfile="$password_file" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 > /dev/null
    rm -f "$password_file"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
    if [ "$database" != postgres ]; then
        as_postgres psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres \
            -c "CREATE DATABASE \"$database\""
    fi
    for script in /docker-entrypoint-initdb.d/*.sql; do
        [ -e "$script" ] || continue
        echo "running $script"
        as_postgres psql -v ON_ERROR_STOP=1 --username "$user" --dbname "$database" -f "$script"
    done
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
fi
if [ "$1" = postgres ]; then
    shift
    exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
