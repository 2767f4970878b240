"""Static facts about the ``cpu-arm-acl`` backend. Importing this builds and loads nothing."""

from plugin_api.contract import BackendDescriptor, OpFamily

DESCRIPTOR = BackendDescriptor(
    id="cpu-arm-acl",
    host_api=">=1.0,<2",
    priority=10,
    families=(OpFamily.ATTENTION, OpFamily.GEMM, OpFamily.QUANT),
    device_kinds=("cpu",),
    hooks="plugin_api_cpu_arm_acl.hooks",
    summary="Arm CPUs (Graviton, Neoverse) through oneDNN with ACL; x86 oneDNN experimental",
    libraries=("onednn-cpu-gomp",),
    settings=(
        "PLUGIN_API_ONEDNN_ROOT",
        "PLUGIN_API_ONEDNN_THREADS",
        "PLUGIN_API_ONEDNN_LM_HEAD",
        "PLUGIN_API_ONEDNN_GEMV",
        "PLUGIN_API_ONEDNN_LARGE_M",
        "PLUGIN_API_ONEDNN_PANEL",
        "PLUGIN_API_ONEDNN_ATTENTION_MATRIX",
        "PLUGIN_API_ONEDNN_ATTENTION_PREFETCH",
    ),
)
