#!/bin/sh
# Install the OpenSSH server that tests/test_ssh.py starts privately on 127.0.0.1, and the
# csh, tcsh and fish login shells the injection tests give their throwaway users.
# Idempotent (does nothing when all are there) and quiet (apt output is shown only when
# something fails). Never starts the system service.
set -eu

if [ -x /usr/sbin/sshd ] && [ -x /usr/bin/tcsh ] && [ -x /usr/bin/csh ] && [ -x /usr/bin/fish ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-sshd: /usr/sbin/sshd is missing and apt-get is not available; install openssh-server" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-sshd: need root (or sudo) to install openssh-server" >&2
        exit 1
    fi
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq >"$log" 2>&1 ||
   ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        openssh-server tcsh csh fish >>"$log" 2>&1; then
    cat "$log" >&2
    echo "install-sshd: apt-get failed (output above)" >&2
    exit 1
fi

if [ ! -x /usr/sbin/sshd ]; then
    cat "$log" >&2
    echo "install-sshd: openssh-server installed but /usr/sbin/sshd is still missing" >&2
    exit 1
fi
# sshd refuses to start as root without its privilege-separation directory.
if [ "$(id -u)" -eq 0 ]; then
    install -d -m755 /run/sshd
else
    $SUDO install -d -m755 /run/sshd
fi
