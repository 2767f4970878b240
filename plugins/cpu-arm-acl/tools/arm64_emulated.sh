#!/bin/bash
# Run tools/attention_check.py on an emulated aarch64 CPU: a Debian arm64 chroot under
# qemu-user, with PyPI's aarch64 CPU build of torch, so that the attention kernels' neon variant
# is compiled by a real aarch64 g++ and run against the oracle. Correctness only (emulated speed
# says nothing). Needs root on a Debian x86-64 host (apt, binfmt_misc, chroot, unshare); the
# first run took 24 minutes on 2 cores (debootstrap, pip, then the emulated build and check).
#   usage: plugins/cpu-arm-acl/tools/arm64_emulated.sh [attention_check.py arguments]
# ARM64_ROOT (default /var/tmp/plugin-api-arm64) keeps the chroot between runs; each run checks
# the repository's committed HEAD.
set -euo pipefail
export ROOT=${ARM64_ROOT:-/var/tmp/plugin-api-arm64}
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
export REPO
# PyPI's aarch64 wheel of torch 2.13.0 is a CUDA build that needs GBs of NVIDIA libraries;
# 2.9.1's is a CPU build, and the plugin asks for torch>=2.4.
export TORCH=${ARM64_TORCH:-torch==2.9.1}

if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static debootstrap
fi
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
# F: the kernel opens the interpreter at registration, so it need not exist inside the chroot
if ! grep -qs 'flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64
  printf '%s' ':qemu-aarch64:M:0:\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:FP' \
    >/proc/sys/fs/binfmt_misc/register
fi
if [ ! -x "$ROOT/usr/bin/python3" ]; then
  debootstrap --arch=arm64 --include=python3-venv,python3-dev,g++,ninja-build,ca-certificates \
    bookworm "$ROOT" http://deb.debian.org/debian
fi
rm -rf "$ROOT/src" && git clone -q "$REPO" "$ROOT/src"

# In a private mount namespace, so that the binds (and the emulated CPU's cpuinfo over
# /proc/cpuinfo, which qemu-user leaves showing the host's x86 flags) end with the run. The
# script runs in that namespace and expands its own variables (exported above).
# shellcheck disable=SC2016
exec unshare -m bash -ec '
  for d in proc sys dev; do mount --bind "/$d" "$ROOT/$d"; done
  in_root() { chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    PYTHONPATH=/src:/src/plugins/cpu-arm-acl "$@"; }
  if [ ! -x "$ROOT/opt/venv/bin/python" ]; then
    # the host CAs too, for a TLS-intercepting proxy between this machine and PyPI
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/" || true
    in_root update-ca-certificates
    in_root python3 -m venv /opt/venv
    in_root pip install -q --cert /etc/ssl/certs/ca-certificates.crt "$TORCH" "pluggy>=1.5" \
      importlib-metadata "pytest>=8" "hypothesis>=6.100" ninja numpy
  fi
  in_root python /src/plugins/cpu-arm-acl/tools/emulated_cpuinfo.py >"$ROOT/cpuinfo"
  mount --bind "$ROOT/cpuinfo" "$ROOT/proc/cpuinfo"
  in_root python /src/plugins/cpu-arm-acl/tools/attention_check.py "$@"
' arm64 "$@"
