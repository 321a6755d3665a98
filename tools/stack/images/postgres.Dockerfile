# `make test-stack` only: a stand-in for postgres:15 (no image registry is reachable there), built from Debian's
# postgresql-15 and tagged postgres:15. Its entrypoint honours what the compose file uses of the official image:
# POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA and /docker-entrypoint-initdb.d/*.sql.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /docker-entrypoint-initdb.d /var/run/postgresql /var/lib/postgresql/data \
 && chown -R postgres:postgres /var/run/postgresql /var/lib/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY --chmod=755 postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
