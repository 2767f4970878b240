#!/usr/bin/env bash
# Every GPU check of the cuda-sm90 plugin in one run, on an SM90 machine without network.
#
#   here:   bash plugins/cuda-sm90/gpu_prepare.sh          # fills .whl/ (trimmed flashinfer...)
#   device: run(command="bash plugins/cuda-sm90/gpu_check.sh", carry=[".whl"], timeout_s=600)
#
# Stages (logged under $OUT, one line each in $OUT/summary.txt with rc and seconds):
#   install   flashinfer + deps from .whl/ into /tmp/site; this checkout, editable
#   env       GPU, versions, `plugin-api doctor --json` on the real machine
#   kit       the conformance kit on cuda-sm90 (oracle comparison; on CUDA its graph test
#             captures and replays every accepted spec and compares with eager)
#   gpu       the plugin's GPU tests: padded one-token graphs, replay after re-planning, the K/V
#             write (one kernel, bit-exact against the reference), pinned staging under load,
#             the int8 W8A8 path (no host sync, graph replay, bit-exact against the reference)
#   targets   issue targets: decode K/V bytes/s vs copy bandwidth (and at each block size),
#             LM head 40x4096x248320 twice
#   overhead  eager decode step vs graph replay, and a cProfile of eager steps (into targets.log)
#   bench     `plugin-api bench --op attention --op gemm` (if this checkout has the verb)
#   serve     vLLM's OpenAI server on the bridge (plugin-api-vllm) on CUDA: a tiny local model,
#             the readiness tool, one completion, SIGTERM (into setup.log). Needs a vLLM CUDA
#             build beside this machine's torch; where none imports it says so and exits 3.
# STAGES="kit gpu" runs a subset (install and env always run). A stage that cannot finish
# before DEADLINE seconds (default 560, under the 600 s call limit) is skipped and says so.
# FlashInfer compiles its kernels on first use (nvcc, JIT): the kit runs under pytest-xdist
# so that modules compile in parallel; the cache in /tmp/flashinfer-jit serves later stages.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"kit gpu targets overhead bench serve"}
DEADLINE=${DEADLINE:-560}
export PYTHONUNBUFFERED=1 PLUGIN_API_BACKEND=cuda-sm90
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-jit FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
summary=$OUT/summary.txt
: >"$summary"
t0=$SECONDS

note() { echo "$*" | tee -a "$summary"; }

# stage NAME LOG LIMIT CMD...: run with a time limit, log to $OUT/LOG.log, record the outcome
# (at most 8 files come back from $OUT: summary, setup, kit, gpu, targets x2, bench x2)
stage() {
    local name=$1 log=$2 limit=$3
    shift 3
    local left=$((DEADLINE - (SECONDS - t0)))
    if [ "$left" -lt 20 ]; then
        note "$name: SKIPPED, ${left}s left before the deadline"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local start=$SECONDS rc
    if declare -F "$1" >/dev/null; then  # a function of this script: run it in a child bash
        timeout "$limit" bash -c "$(declare -f "$1"); $1" >>"$OUT/$log.log" 2>&1
    else
        timeout "$limit" "$@" >>"$OUT/$log.log" 2>&1
    fi
    rc=$?
    local took=$((SECONDS - start))
    if [ "$rc" -eq 124 ]; then
        note "$name: TIMED OUT after ${took}s (limit ${limit}s); see $log.log"
    else
        note "$name: rc=$rc in ${took}s; see $log.log"
    fi
    return 0
}

install() {
    set -e
    ls -l .whl
    local fi_wheels=()
    for w in .whl/*.whl; do
        case $(basename "$w") in plugin_api*) ;; *) fi_wheels+=("$w") ;; esac
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "${fi_wheels[@]}"
    if python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/cuda-sm90; then
        echo "installed this checkout (editable)"
    else
        echo "editable install failed: installing the carried wheels of plugin-api instead"
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/plugin_api*.whl
    fi
    PYTHONPATH=/tmp/site python3 -c "import flashinfer, plugin_api_cuda_sm90; print('flashinfer', flashinfer.__version__)"
}

envinfo() {
    nvidia-smi
    python3 -c "import torch, sys; print(sys.version); print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
    nvcc --version | tail -1
    python3 -m plugin_api doctor --json
}

# vLLM 0.32's CUDA wheel (about 330 MB, torch==2.13.0) cannot travel in the 64 MiB carried here,
# and this machine's image has torch 2.11: the stage runs only where an image brings vLLM.
serve() {
    set -e
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e integrations/vllm
    if ! python3 -c "import vllm" 2>/dev/null; then
        echo "serve: no vLLM importable here (torch $(python3 -c 'import torch; print(torch.__version__)'));"
        echo "serve: the bridge on CUDA needs a vLLM CUDA build that matches this torch"
        exit 3
    fi
    python3 -c "from plugin_api_vllm.versions import check_vllm; check_vllm()"
    local model=/tmp/plugin-api-tiny-llama port=8765
    python3 -m plugin_api_vllm.tiny_model llama "$model"
    PLUGIN_API_STRICT=1 python3 -m vllm.entrypoints.launchers.api_server.entry --model "$model" \
        --served-model-name tiny-llama --host 127.0.0.1 --port "$port" --dtype bfloat16 \
        --max-model-len 1024 &
    local pid=$!
    trap 'kill -TERM $pid 2>/dev/null; wait $pid' EXIT
    python3 -m plugin_api_vllm.ready "http://127.0.0.1:$port" --model tiny-llama --timeout 240
    curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model": "tiny-llama", "prompt": "Hello, my name is", "max_tokens": 16, "temperature": 0}'
    echo
}

if [ ! -d .whl ]; then
    note "install: NOT RUN: no .whl/ (run plugins/cuda-sm90/gpu_prepare.sh here and carry .whl)"
    note "without flashinfer the plugin is unavailable: no other stage can run"
    exit 1
fi
stage install setup 120 install
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
stage env setup 60 envinfo
xdist=()
python3 -c "import xdist" 2>/dev/null && xdist=(-n 8)
for s in $STAGES; do
    case $s in
    kit) stage kit kit 330 python3 -m pytest -q -p no:cacheprovider "${xdist[@]}" --plugin-api-backend=cuda-sm90 -ra ;;
    gpu) stage gpu gpu 180 python3 -m pytest -q -p no:cacheprovider -ra plugins/cuda-sm90/tests/test_gpu.py plugins/cuda-sm90/tests/test_kv_write.py plugins/cuda-sm90/tests/test_gemm.py ;;
    targets) stage targets targets 150 python3 plugins/cuda-sm90/tools/targets.py "$OUT/targets.json" ;;
    overhead) stage overhead targets 90 python3 plugins/cuda-sm90/tools/overhead.py ;;
    bench)
        if python3 -m plugin_api bench --help >/dev/null 2>&1; then
            stage bench bench 180 python3 -m plugin_api bench --op attention --op gemm \
                --backend cuda-sm90 --json "$OUT/bench.json"
        else
            note "bench: NOT RUN: this checkout's plugin-api has no 'bench' verb yet"
        fi
        ;;
    serve) stage serve setup 300 serve ;;
    *) note "$s: unknown stage (kit, gpu, targets, overhead, bench, serve)" ;;
    esac
done
note "total ${SECONDS}s; logs in $OUT"
