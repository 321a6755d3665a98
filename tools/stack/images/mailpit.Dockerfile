# `make test-stack` only: a stand-in for Mailpit (no image registry is reachable there), tagged like the compose
# file's axllent/mailpit image. SMTP on MP_SMTP_BIND_ADDR (aiosmtpd), and the part of Mailpit's HTTP API the
# stack test reads on MP_UI_BIND_ADDR: GET /livez, GET /api/v1/messages, GET /api/v1/message/ID.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-aiosmtpd \
 && rm -rf /var/lib/apt/lists/*
COPY mail_sink.py /usr/local/bin/mail_sink.py
# `/mailpit readyz`, the compose file's healthcheck, as in Mailpit's image
COPY --chmod=755 mailpit-readyz.sh /mailpit
ENTRYPOINT ["python3", "/usr/local/bin/mail_sink.py"]
