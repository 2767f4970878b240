#!/bin/bash
# Check the plugin on an emulated aarch64 CPU: a Debian trixie arm64 chroot under qemu-user, with
# PyPI's aarch64 CPU build of torch; the extension is compiled there by a real aarch64 g++.
# Correctness only (emulated speed says nothing). Needs root on a Debian x86-64 host (apt,
# binfmt_misc, chroot, unshare).
#   usage: plugins/cpu-arm-acl/tools/arm64_emulated.sh attention [attention_check.py arguments]
#          plugins/cpu-arm-acl/tools/arm64_emulated.sh onednn [pytest arguments]
#          plugins/cpu-arm-acl/tools/arm64_emulated.sh wheel [wheel_check.py arguments]
# attention: the attention kernels' neon variant against the oracle (tools/attention_check.py).
# onednn: oneDNN 3.7.2 with Debian's ACL 24.11 (cross-compiled on this host into the chroot's
#   /opt/onednn-acl), then the plugin's probe, kernel-probe, GEMM (oneDNN and panel) and quant
#   tests and the conformance kit's gemm and quant cases with PLUGIN_API_STRICT=1, so that a
#   primitive on oneDNN's reference kernel fails them.
# wheel: with that oneDNN, every distribution built (sdist + wheel; cpu-arm-acl's a
#   linux_aarch64 wheel with its kernels compiled by the chroot's g++) and the wheels checked in a
#   fresh venv as tests/wheels/wheel_check.py does on x86 (no compiler may run), with
#   plugin-api check on the kit's gemm and quant cases (--kit EXPR: another subset). The wheels
#   stay in $ARM64_ROOT/wheels.
# ARM64_ROOT (default /var/tmp/plugin-api-arm64-trixie) keeps the chroot, its venv and oneDNN
# between runs; each run checks the repository's committed HEAD. ARM64_QEMU_CPU (default
# max,sve-default-vector-length=16: 128-bit SVE with BF16 and I8MM, as Neoverse V2 / Graviton4;
# 32 is Neoverse V1 / Graviton3, where oneDNN prefers its own sve_256 kernels) is the emulated CPU.
set -euo pipefail
MODE=${1:-}
case "$MODE" in
  attention | onednn | wheel) shift ;;
  *) echo "usage: $0 attention|onednn|wheel [arguments]" >&2 && exit 2 ;;
esac
export ROOT=${ARM64_ROOT:-/var/tmp/plugin-api-arm64-trixie}
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
export REPO MODE
export QEMU_CPU=${ARM64_QEMU_CPU:-max,sve-default-vector-length=16}
# PyPI's aarch64 wheel of torch 2.13.0 is a CUDA build that needs GBs of NVIDIA libraries;
# 2.9.1's is a CPU build, and the plugin asks for torch>=2.4.
export TORCH=${ARM64_TORCH:-torch==2.9.1}
# oneDNN 3.7.2's source as Debian ships it; Debian's own libdnnl is built without ACL.
ONEDNN_URL=http://deb.debian.org/debian/pool/main/o/onednn/onednn_3.7.2+ds.orig.tar.xz
ONEDNN_SHA256=0cc51ca26c1af6a2bb1e71e378e7046f3ceb3e71791ee9d4e246d50f904a6ea6

need=(qemu-user-static debootstrap)
[ "$MODE" != attention ] && need+=(g++-aarch64-linux-gnu cmake ninja-build xz-utils curl)
if ! dpkg -s "${need[@]}" >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
# F: the kernel opens the interpreter at registration, so it need not exist inside the chroot
if ! grep -qs 'flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64
  printf '%s' ':qemu-aarch64:M:0:\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:FP' \
    >/proc/sys/fs/binfmt_misc/register
fi
if [ ! -x "$ROOT/usr/bin/python3" ]; then
  # trixie: its ACL (24.11) is the first Debian release new enough for oneDNN 3.7
  debootstrap --arch=arm64 \
    --include=python3-venv,python3-dev,g++,ninja-build,ca-certificates,libarm-compute-dev,git \
    trixie "$ROOT" http://deb.debian.org/debian
fi

if [ "$MODE" != attention ] && [ ! -e "$ROOT/opt/onednn-acl/lib/libdnnl.so" ]; then
  work="$ROOT/opt/onednn-build"
  mkdir -p "$work"
  curl -fsSL -o "$work/onednn.tar.xz" "$ONEDNN_URL"
  echo "$ONEDNN_SHA256  $work/onednn.tar.xz" | sha256sum -c -
  rm -rf "$work/src" && mkdir "$work/src"
  tar -xJf "$work/onednn.tar.xz" -C "$work/src" --strip-components=1
  # ACL 24.11 lacks CpuGemmAssemblyDispatch::has_stateless_impl (24.11.1, oneDNN 3.7's
  # minimum), which only decides whether oneDNN serialises a matmul's execution: always do.
  sed -i 's|if (!acl_obj_->asm_gemm.has_stateless_impl()) { locker.lock(); }|locker.lock();|' \
    "$work/src/src/cpu/aarch64/matmul/acl_matmul.cpp"
  grep -q '^    locker.lock();' "$work/src/src/cpu/aarch64/matmul/acl_matmul.cpp"
  cat >"$work/aarch64.cmake" <<'EOF'
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
EOF
  # ACL's headers alone: the chroot's include directory also holds trixie's glibc headers,
  # which must not mix with the cross compiler's
  acl_inc="$work/acl-include" acl_lib="$ROOT/usr/lib/aarch64-linux-gnu"
  rm -rf "$acl_inc" && mkdir -p "$acl_inc"
  sed -n 's|^/usr/include/aarch64-linux-gnu/\([^/]*\)/.*|\1|p' \
    "$ROOT/var/lib/dpkg/info/libarm-compute-dev:arm64.list" | sort -u |
    while read -r d; do cp -a "$ROOT/usr/include/aarch64-linux-gnu/$d" "$acl_inc/"; done
  # the matmul and reorder primitives only (what the plugin uses); ACL's own dependencies
  # (trixie's libstdc++) are resolved in the chroot at run time, not by this host's linker
  rm -rf "$work/build"
  cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$work/aarch64.cmake" -DCMAKE_INSTALL_PREFIX="$ROOT/opt/onednn-acl" \
    -DDNNL_AARCH64_USE_ACL=ON -DACL_INCLUDE_DIR="$acl_inc" -DACL_EXTRA_INCLUDE_DIR="$acl_inc" \
    -DACL_LIBRARY="$acl_lib/libarm_compute.so" \
    -DACL_GRAPH_LIBRARY="$acl_lib/libarm_compute_graph.so" \
    -DDNNL_CPU_RUNTIME=OMP -DDNNL_ENABLE_PRIMITIVE="MATMUL;REORDER" \
    -DDNNL_ENABLE_WORKLOAD=INFERENCE -DONEDNN_BUILD_GRAPH=OFF -DDNNL_BUILD_TESTS=OFF \
    -DDNNL_BUILD_EXAMPLES=OFF -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--allow-shlib-undefined
  cmake --build "$work/build"
  cmake --install "$work/build"
fi
rm -rf "$ROOT/src" && git clone -q "$REPO" "$ROOT/src"

# In a private mount namespace, so that the binds (and the emulated CPU's cpuinfo over
# /proc/cpuinfo, which qemu-user leaves showing the host's x86 flags) end with the run. The
# script runs in that namespace and expands its own variables (exported above).
# shellcheck disable=SC2016
exec unshare -m bash -ec '
  for d in proc sys dev; do mount --bind "/$d" "$ROOT/$d"; done
  in_root() { chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    QEMU_CPU="$QEMU_CPU" PLUGIN_API_ONEDNN_ROOT=/opt/onednn-acl "$@"; }
  if [ ! -x "$ROOT/opt/venv/bin/pytest" ]; then
    # the host CAs too, for a TLS-intercepting proxy between this machine and PyPI
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/" || true
    in_root update-ca-certificates
    in_root python3 -m venv /opt/venv
    in_root pip install -q --cert /etc/ssl/certs/ca-certificates.crt "$TORCH" "pluggy>=1.5" \
      importlib-metadata packaging "pytest>=8" "hypothesis>=6.100" markdown-it-py ninja numpy \
      "setuptools>=77" build
  fi
  in_root python /src/plugins/cpu-arm-acl/tools/emulated_cpuinfo.py >"$ROOT/cpuinfo"
  mount --bind "$ROOT/cpuinfo" "$ROOT/proc/cpuinfo"
  if [ "$MODE" = wheel ]; then
    # a chroot made before this mode: the tools it needs (git: wheel_check copies the tracked tree)
    [ -x "$ROOT/usr/bin/git" ] || in_root sh -c "apt-get update -q && apt-get install -y -q git"
    [ -x "$ROOT/opt/venv/bin/pyproject-build" ] ||
      in_root pip install -q --cert /etc/ssl/certs/ca-certificates.crt build
    mkdir -p "$ROOT/wheels"
    in_root env -C /src PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
      python tests/wheels/wheel_check.py --dist /wheels --kit "gemm or quant" "$@"
    ls -l "$ROOT/wheels"
    exit
  fi
  in_root pip install -q --no-deps --no-build-isolation -e /src -e /src/plugins/cpu-arm-acl
  if [ "$MODE" = attention ]; then
    in_root python /src/plugins/cpu-arm-acl/tools/attention_check.py "$@"
    exit
  fi
  tests=/src/plugins/cpu-arm-acl/tests
  # the backend itself, or an error (the tests would only skip without it)
  in_root env PLUGIN_API_BACKEND=cpu-arm-acl plugin-api doctor
  in_root env -C /src PLUGIN_API_STRICT=1 pytest -q -p no:cacheprovider "$tests/test_probe.py" \
    "$tests/test_kernel_probe.py" "$tests/test_gemm.py" "$tests/test_panel_gemm.py" \
    "$tests/test_quant.py" "$@"
  in_root env -C /src PLUGIN_API_STRICT=1 pytest -q -p no:cacheprovider \
    --plugin-api-backend=cpu-arm-acl -k "gemm or quant" "$@"
' arm64 "$@"
