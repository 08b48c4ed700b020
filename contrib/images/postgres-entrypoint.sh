#!/bin/sh
# The entrypoint of contrib/example-images.sh's postgres image: the parts of
# the official image's docker-entrypoint.sh that the examples rely on.
#  - `postgres ...` (the default; or only flags): as root, owns PGDATA and the
#    socket directory to postgres and drops to it; on an empty PGDATA runs
#    initdb with the superuser's password from POSTGRES_PASSWORD or
#    POSTGRES_PASSWORD_FILE (or POSTGRES_HOST_AUTH_METHOD=trust), local
#    connections trusted, every other host by scram-sha-256, listening on all
#    addresses.
#  - anything else (psql, openssl, sh) is run as it is.
set -eu
if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi
[ "$1" = postgres ] || exec "$@"

: "${PGDATA:=/var/lib/postgresql/data}"
# Read as root, like the official image: the file may be root's alone.
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ] && [ -z "${POSTGRES_PASSWORD:-}" ] && [ -r "$POSTGRES_PASSWORD_FILE" ]; then
	POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
	export POSTGRES_PASSWORD
	unset POSTGRES_PASSWORD_FILE
fi
if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 0700 "$PGDATA"
	exec /usr/bin/setpriv --reuid=999 --regid=999 --clear-groups -- "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	pw=${POSTGRES_PASSWORD:-}
	method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
	if [ -z "$pw" ] && [ "$method" != trust ]; then
		echo "error: the database is uninitialized and the superuser's password is not set;" >&2
		echo "  set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE (or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "${pw:-unused}" >"$pwfile"
	initdb -D "$PGDATA" --username="${POSTGRES_USER:-postgres}" --pwfile="$pwfile" \
		-E UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host="$method" >/dev/null
	rm -f "$pwfile"
	printf 'host all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"
	printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	echo "initialised $PGDATA"
fi
exec "$@"
