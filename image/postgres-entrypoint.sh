#!/bin/sh
# The postgres image's entrypoint (faultline's embedded store: the chart's PostgreSQL StatefulSet).
# First start (no $PGDATA/PG_VERSION): initdb with the superuser $POSTGRES_USER and the password
# $POSTGRES_PASSWORD (the chart's generated Secret), scram-sha-256 for every network client, trust only
# on the pod's own Unix socket. Then PostgreSQL in the foreground as PID 1 on every interface, port 5432.
# The chart's preStop runs `pg_ctl stop --mode=fast` (PostgreSQL's SIGTERM would wait for FerretDB's
# pooled connections to close).
set -eu
: "${PGDATA:?PGDATA is required}"
user=${POSTGRES_USER:-faultline}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?the first start needs POSTGRES_PASSWORD}"
  pwfile=$(mktemp)
  trap 'rm -f "$pwfile"' EXIT
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" --encoding=UTF8 --no-locale \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "faultline-postgres: initialised $PGDATA (superuser $user)" >&2
fi
chmod 0700 "$PGDATA"  # a volume's fsGroup may have added group bits, which PostgreSQL refuses
exec postgres -D "$PGDATA" -c listen_addresses='*' -c port=5432 \
  -c unix_socket_directories=/run/postgresql -c password_encryption=scram-sha-256 -c jit=off "$@"
