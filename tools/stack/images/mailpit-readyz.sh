#!/bin/sh
# `/mailpit readyz` of the Mailpit stand-in: exit 0 when its HTTP API answers.
[ "${1:-}" = readyz ] || { echo "only 'readyz' is supported" >&2; exit 2; }
exec python3 -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:' + os.environ.get('MP_UI_BIND_ADDR', ':8025').rsplit(':', 1)[1] + '/readyz', timeout=5)"
