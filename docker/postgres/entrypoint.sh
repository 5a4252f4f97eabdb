#!/bin/sh
# First start: a cluster in $PGDATA whose superuser is $POSTGRES_USER (password authentication
# over TCP) with the database $POSTGRES_DB. Every start: the server in the foreground.
set -eu
: "${POSTGRES_USER:?set POSTGRES_USER}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
export PATH="$bin:$PATH"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
         --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  # the database, made on a server that listens on a private socket only
  pg_ctl --pgdata="$PGDATA" --wait --silent -o "-c listen_addresses='' -k /tmp" start
  if [ "$POSTGRES_DB" != postgres ]; then
    createdb --host=/tmp --username="$POSTGRES_USER" "$POSTGRES_DB"
  fi
  pg_ctl --pgdata="$PGDATA" --wait --silent stop
  echo "aoq-postgres: made the cluster in $PGDATA with database $POSTGRES_DB"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -k /tmp
