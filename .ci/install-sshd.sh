#!/bin/sh
# Install the OpenSSH server that tests/test_ssh.py starts privately on 127.0.0.1, and the
# csh, tcsh and fish login shells its injection tests give their throwaway users.
# Idempotent (does nothing when all four exist) and quiet. Never starts the system service.
set -eu
sh "$(dirname "$0")/apt-install.sh" install-sshd "/usr/sbin/sshd /usr/bin/csh /usr/bin/tcsh /usr/bin/fish" \
    openssh-server csh tcsh fish

# sshd refuses to start as root without its privilege-separation directory.
if [ -d /run/sshd ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    install -d -m755 /run/sshd
elif command -v sudo >/dev/null 2>&1; then
    sudo install -d -m755 /run/sshd
fi
