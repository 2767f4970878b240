"""Check the CPU attention kernels' variant for this machine against the dense oracle.

It drives the plugin's implementation object (plan, write_kv, forward) instead of a live backend,
so it also runs where the backend's probe cannot pass: an Arm machine, or the arm64 chroot of
``arm64_emulated.sh``, without an ACL-enabled oneDNN (the attention kernels do not use oneDNN).
Cases: every feature of the conformance kit on each of its batches, and odd shapes (head sizes
64/80/128/256, bf16/fp16/fp32, contexts ending on block boundaries, a prefill tile beside
decodes), for each thread count and matrix setting asked for.

usage: python plugins/cpu-arm-acl/tools/attention_check.py [--threads N ...] [--matrix M ...]
                                                          [--json PATH]
Exit status 1 when a case fails or none ran.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from plugin_api.conformance.cases import make_case
from plugin_api.conformance.test_attention import (
    BATCHES,
    FEATURES,
    SPEC_BATCHES,
    TOLERANCE,
    spec_of,
)
from plugin_api.device_info import DeviceInfo, read_device_info
from plugin_api.ops.attention import AttentionSpec
from plugin_api_cpu_arm_acl import _attention_ext as ext
from plugin_api_cpu_arm_acl.attention import CpuPagedAttention
from plugin_api_cpu_arm_acl.settings import MATRIX_MODES

Batch = tuple[list[int], list[int], int]  # (query_lens, seq_lens, num_decodes)
ODD_BATCHES: dict[str, Batch] = {
    "block-boundaries": ([1, 1, 16], [16, 32, 64], 2),
    "decode-and-prefill": ([1, 3, 40], [70, 19, 40], 2),
}


def cases() -> Iterator[tuple[str, AttentionSpec, Batch]]:
    for (fname, feature), (bname, batch) in itertools.product(FEATURES.items(), BATCHES.items()):
        yield f"{fname} {bname}", spec_of(**feature), batch
    for (fname, feature), (bname, batch) in itertools.product(
        FEATURES.items(), SPEC_BATCHES.items()
    ):
        longest = max(batch[0][: batch[2]])
        yield f"{fname} {bname}", spec_of(**feature, num_speculative_tokens=longest - 1), batch
    for head, dtype, (bname, batch) in itertools.product(
        (64, 80, 128, 256), (torch.bfloat16, torch.float16, torch.float32), ODD_BATCHES.items()
    ):
        spec = spec_of(num_heads=8, num_kv_heads=2, head_size=head, dtype=dtype)
        yield f"head-{head} {str(dtype).removeprefix('torch.')} {bname}", spec, batch


def check(
    impl: CpuPagedAttention, info: DeviceInfo, spec: AttentionSpec, batch: Batch, seed: int
) -> str | None:
    """None when the kernels match the oracle, else what differed; 'skip' when unsupported."""
    if not impl.supports(spec, info).ok:
        return "skip"
    cpu = torch.device("cpu")
    query_lens, seq_lens, num_decodes = batch
    case = make_case(spec, query_lens, seq_lens, num_decodes=num_decodes, device=cpu, seed=seed)
    plan = impl.plan(spec, case.batch, cpu, None)
    if case.key is not None and case.value is not None:
        impl.write_kv(spec, case.key, case.value, case.cache, plan)
    out = torch.full(case.query.shape, float("nan"), dtype=spec.dtype)
    impl.forward(spec, case.query, case.cache, plan, case.sinks, out)
    got = out[: case.num_tokens].float()
    if not torch.isfinite(got).all():
        return "rows left unwritten (NaN) or non-finite output"
    try:
        torch.testing.assert_close(got, case.expected(), **TOLERANCE[spec.dtype])
    except AssertionError as e:
        return " ".join(str(e).split())
    return None


def thread_count(text: str) -> int:
    n = int(text) if text.strip().isdigit() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=thread_count, nargs="+", default=[1, 2])
    parser.add_argument("--matrix", nargs="+", choices=MATRIX_MODES, default=["off", "on"])
    parser.add_argument("--json", metavar="PATH", help="write the summary here")
    args = parser.parse_args(argv)

    info = read_device_info()
    isa = ext.isa_path(info)
    print(f"{platform.machine()}, torch {torch.__version__}, variant {isa and isa.name}")
    if isa is None:
        print("no attention kernel variant for this CPU")
        return 1
    start = time.monotonic()
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures: list[dict[str, str]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for matrix in args.matrix:
            impl = CpuPagedAttention(matrix=matrix)
            for seed, (name, spec, batch) in enumerate(cases()):
                label = f"threads={threads} matrix={matrix} {name}"
                why = check(impl, info, spec, batch, seed)
                if why is None:
                    counts["passed"] += 1
                elif why == "skip":
                    counts["skipped"] += 1
                else:
                    counts["failed"] += 1
                    failures.append({"case": label, "why": why})
                    print(f"FAIL {label}: {why[:300]}")
            print(f"threads={threads} matrix={matrix}: {counts} ({time.monotonic() - start:.0f} s)")
    summary = {
        "machine": platform.machine(),
        "cpu_flags": sorted(info.cpu_flags),
        "torch": torch.__version__,
        "variant": isa.name,
        **counts,
        "failures": failures,
        "seconds": round(time.monotonic() - start, 1),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 1 if counts["failed"] or not counts["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
