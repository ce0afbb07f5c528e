#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL cluster on loopback for the tests.
#   scripts/postgres.sh start DIR PORT   → prints the SQLAlchemy URL on stdout
#   scripts/postgres.sh stop DIR
# Installs Debian's postgresql when the server binaries are missing (CI on a new machine).
set -euo pipefail
cmd=${1:?start|stop}; dir=${2:?data dir}; port=${3:-55432}

find_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
  return 1
}
bin=$(find_bin) || {
  echo "==> installing postgresql (Debian)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
  bin=$(find_bin)
}
# PostgreSQL refuses to run as root; use its own system user when we are root.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "$cmd" in
  start)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    if [ ! -f "$dir/PG_VERSION" ]; then
      as_pg "$bin/initdb" -D "$dir" -U ablab --auth=trust -E UTF8 >/dev/null
    fi
    as_pg "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
    as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U ablab -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='ablab_test'" | grep -q 1 \
      || as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U ablab ablab_test
    echo "postgresql+psycopg://ablab@127.0.0.1:$port/ablab_test"
    ;;
  stop)
    [ -f "$dir/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null || true
    ;;
  *) echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
