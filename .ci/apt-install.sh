#!/bin/sh
# Install Debian packages unless the binaries they provide already exist.
#   sh .ci/apt-install.sh NAME "BINARY..." PACKAGE...
# Idempotent and quiet (apt output is shown only when something fails); never starts a service.
set -eu
name=$1
binaries=$2
shift 2

missing=""
for binary in $binaries; do
    [ -x "$binary" ] || missing="$missing $binary"
done
[ -z "$missing" ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "$name:$missing missing and apt-get is not available; install: $*" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "$name: need root (or sudo) to install: $*" >&2
        exit 1
    fi
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! $SUDO apt-get update -qq >"$log" 2>&1 ||
   ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "$name: apt-get failed (output above)" >&2
    exit 1
fi

for binary in $binaries; do
    if [ ! -x "$binary" ]; then
        cat "$log" >&2
        echo "$name: $* installed but $binary is still missing" >&2
        exit 1
    fi
done
