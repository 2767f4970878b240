"""Run a command on this x86 machine with its software stack capped to AVX2: the code paths an
AVX2-only CPU (Zen 2/3, Haswell to Comet Lake) takes, on this machine's cores and memory.

    python plugins/cpu-arm-acl/tools/avx2_capped.py --check
    python plugins/cpu-arm-acl/tools/avx2_capped.py -- COMMAND [ARG...]

Each layer decides its ISA its own way, so each is capped where it decides:

- plugin-api and its plugins read ``/proc/cpuinfo``: a copy without the AVX-512, AMX and
  AVX-VNNI flags is bind-mounted over it in a private mount namespace (``unshare -m``; root).
  cpu-arm-acl's development build compiles the level a wheel loads for those flags (its
  ``avx2`` variant: no AVX-512 in the quant kernel, no bf16 GEMV), in a cache folder of its own;
- oneDNN (the plugin's, torch's and vLLM's) and MKL ask CPUID: ``ONEDNN_MAX_CPU_ISA`` and
  ``MKL_ENABLE_INSTRUCTIONS``;
- torch's vectorised kernels and Inductor's code: ``ATEN_CPU_CAPABILITY``; and the flags
  Inductor compiles that code with: ``TORCHINDUCTOR_CPP_MARCH=x86-64-v3`` (AVX2, FMA, F16C)
  instead of ``-march=native``, whose AVX-512 miscompiles Inductor's AVX2 code (vLLM's
  vocab-parallel embedding mask came out with garbage indices beyond the 8th token);
- ``torch.cpu._is_avx512_supported`` and the other CPUID probes in ``torch.cpu`` (which vLLM
  reads to load ``vllm._C_AVX2`` and choose its attention ISA): report False, through a
  ``sitecustomize`` on ``PYTHONPATH`` that patches them when ``torch.cpu`` is imported.

What the cap cannot change: the cores themselves (AVX2 code on a core built for AVX-512 keeps
its caches, memory and clock), and what asks CPUID itself in C++: torch's dispatch
(``torch._int_mm`` takes oneDNN as on a CPU with AVX512-VNNI, then gets oneDNN's saturating
AVX2 int8 kernel, where an AVX2 CPU runs torch's exact scalar loop) and ``-march=native``
builds (vLLM's own are prebuilt per ISA). Figures taken under the cap are AVX2 code on this
machine, and say so; they stand in for an AVX2 CPU only as far as its core does what this one
does at AVX2 width.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

# flags an AVX2-only CPU does not have (the AVX-512 family, AMX, and the VEX-coded VNNI,
# IFMA and NE-convert extensions that came with them)
HIDDEN_PREFIXES = ("avx512", "amx_", "avx_vnni", "avx_ifma", "avx_ne_convert")
ENV = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",  # the name oneDNN before 3.0 read; harmless after
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3",  # Inductor's -march: the AVX2 level, not native
}
# torch.cpu's CPUID probes that must read False on an AVX2-only CPU (those this torch has)
TORCH_PROBES = (
    "_is_avx512_supported",
    "_is_avx512_vnni_supported",
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)
SITECUSTOMIZE = f'''"""avx2_capped.py: torch.cpu's CPUID probes read False for what AVX2 lacks."""
import importlib.abc
import importlib.machinery
import sys

_PROBES = {TORCH_PROBES!r}


class _CapTorchCpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        inner = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, s):
                return inner.create_module(s)

            def exec_module(self, module):
                inner.exec_module(module)
                for probe in _PROBES:
                    if hasattr(module, probe):
                        setattr(module, probe, lambda: False)

        spec.loader = Loader()
        return spec


sys.meta_path.insert(0, _CapTorchCpu())
'''


def capped_flags(flags: Iterable[str]) -> list[str]:
    """``flags`` in order, without those an AVX2-only CPU lacks."""
    return [f for f in flags if not f.startswith(HIDDEN_PREFIXES)]


def capped_cpuinfo(text: str) -> str:
    """``/proc/cpuinfo`` text with every ``flags`` line capped; every other line as it was."""

    def cap(m: re.Match[str]) -> str:
        return m.group(1) + " ".join(capped_flags(m.group(2).split()))

    return re.sub(r"^(flags\s*:\s*)(.*)$", cap, text, flags=re.MULTILINE)


def capped_command(command: list[str], cpuinfo: Path) -> list[str]:
    """``command`` in a private mount namespace whose ``/proc/cpuinfo`` is ``cpuinfo``."""
    script = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", script, str(cpuinfo), *command]


def unavailable() -> str | None:
    """Why the cap cannot run here, or None."""
    if os.uname().machine != "x86_64":
        return f"not an x86-64 machine ({os.uname().machine})"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux) on PATH"
    if os.geteuid() != 0:
        return "needs root (unshare --mount and mount --bind)"
    text = Path("/proc/cpuinfo").read_text()
    if not re.search(r"^flags\s*:.*\bavx2\b", text, re.MULTILINE):
        return "this CPU has no AVX2"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --mount failed: {probe.stderr.strip()}"
    return None


def report() -> dict[str, object]:
    """What each layer sees (run under the cap by ``--check``)."""
    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor import cpu_vec_isa

    from plugin_api.device_info import read_device_info
    from plugin_api_cpu_arm_acl import _attention_ext, isa

    info = read_device_info()
    variant = _attention_ext.isa_path(info)
    return {
        "cpuinfo_avx512": sorted(f for f in info.cpu_flags if f.startswith(HIDDEN_PREFIXES)),
        "plugin_isa": isa.isa_name(info),
        "attention_variant": variant.name if variant else None,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_probes": {p: getattr(torch.cpu, p)() for p in TORCH_PROBES if hasattr(torch.cpu, p)},
        "inductor_isa": str(cpu_vec_isa.pick_vec_isa()),
        "inductor_march": inductor_config.cpp.march,
        "env": {k: os.environ.get(k) for k in ENV},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="print what each layer sees, as JSON")
    ap.add_argument("--report", action="store_true", help=argparse.SUPPRESS)  # --check's child
    ap.add_argument("command", nargs="*", help="the command to run under the cap")
    args = ap.parse_args(argv)
    if args.report:
        print(json.dumps(report(), indent=1))
        return 0
    if bool(args.check) == bool(args.command):
        ap.error("give --check or a command (after --)")
    why = unavailable()
    if why is not None:
        print(f"avx2_capped: {why}", file=sys.stderr)
        return 2
    command = [sys.executable, __file__, "--report"] if args.check else args.command
    with tempfile.TemporaryDirectory(prefix="avx2-capped-") as folder:
        root = Path(folder)
        (root / "cpuinfo").write_text(capped_cpuinfo(Path("/proc/cpuinfo").read_text()))
        (root / "sitecustomize.py").write_text(SITECUSTOMIZE)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, **ENV, "PYTHONPATH": folder + (os.pathsep + path if path else "")}
        return subprocess.run(capped_command(command, root / "cpuinfo"), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
