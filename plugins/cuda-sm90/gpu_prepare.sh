#!/usr/bin/env bash
# Fills .whl/ at the repository root with what gpu_check.sh installs on the GPU machine, which
# has no network: a trimmed flashinfer-python wheel (the full one is ~100 MB, over the 64 MiB
# that travels), its import-time dependency apache-tvm-ffi and importlib-metadata for Python 3.12,
# (with lazy-importer, which it needs), and wheels of this checkout's plugin-api and plugin-api-cuda-sm90 (used there only if an
# editable install fails). Run it here, on a machine with PyPI, right before the device run.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
py=${PY:-$root/.venv/bin/python}
fi_version=${FLASHINFER_VERSION:-0.7.4}
exclude=$(git rev-parse --git-path info/exclude)
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
full=$(mktemp -d)
trap 'rm -rf "$full"' EXIT
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$full" \
    "flashinfer-python==$fi_version" "apache-tvm-ffi==0.1.15.post2" "importlib-metadata==10.2.0" "lazy-importer==0.1.0"
"$py" "$root/plugins/cuda-sm90/tools/trim_flashinfer_wheel.py" \
    "$full"/flashinfer_python-*.whl .whl
cp "$full"/apache_tvm_ffi-*.whl "$full"/importlib_metadata-*.whl "$full"/lazy_importer-*.whl .whl/
"$py" -m pip wheel -q --no-deps --no-build-isolation -w .whl . plugins/cuda-sm90
du -ch .whl/* | tail -1
size=$(du -sm .whl | cut -f1)
if [ "$size" -gt 60 ]; then
    echo "gpu_prepare: .whl/ is ${size} MiB; with the tree it must stay under 64 MiB" >&2
    exit 1
fi
ls -1 .whl
