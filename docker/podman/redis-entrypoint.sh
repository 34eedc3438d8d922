#!/bin/sh
# What the official Redis image's entrypoint does for `redis-server ...`: started as root, it
# hands /data to the redis user and drops to it; protected mode is off, so other containers
# connect without a password. Any other command runs as given.
set -eu
if [ "${1:-}" = redis-server ]; then
    set -- "$@" --protected-mode no
    if [ "$(id -u)" = 0 ]; then
        chown redis:redis /data
        exec setpriv --reuid=redis --regid=redis --init-groups "$@"
    fi
fi
exec "$@"
