"""Print a /proc/cpuinfo for the Arm CPU this process runs on, built from its ELF auxiliary
vector (AT_HWCAP and AT_HWCAP2, named as Linux's arm64 cpuinfo names them, in bit order).

qemu-user hands the emulated CPU's capabilities to the guest there, while /proc/cpuinfo still
shows the host's (x86 flags, which would make the plugin look for an x86 variant):
``arm64_emulated.sh`` binds this output over /proc/cpuinfo inside its chroot.
"""

from __future__ import annotations

import os
import platform
import struct
import sys
from pathlib import Path

AT_HWCAP, AT_HWCAP2 = 16, 26
# fmt: off
HWCAP = [
    "fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp",
    "asimdhp", "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4",
    "asimddp", "sha512", "sve", "asimdfhm", "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb",
    "paca", "pacg",
]
HWCAP2 = [
    "dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint",
    "svei8mm", "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti", "mte",
    "ecv", "afp", "rpres", "mte3", "sme", "sme_i16i64", "sme_f64f64", "sme_i8i32", "sme_f16f32",
    "sme_b16f32", "sme_f32f32", "sme_fa64",
]
# fmt: on


def features() -> list[str]:
    aux = dict(struct.iter_unpack("<QQ", Path("/proc/self/auxv").read_bytes()))
    h1, h2 = aux.get(AT_HWCAP, 0), aux.get(AT_HWCAP2, 0)
    return [n for i, n in enumerate(HWCAP) if h1 >> i & 1] + [
        n for i, n in enumerate(HWCAP2) if h2 >> i & 1
    ]


def main() -> None:
    if platform.machine() != "aarch64":
        sys.exit(f"emulated_cpuinfo: the HWCAP names are arm64's; this is {platform.machine()}")
    flags = " ".join(features())
    for cpu in range(os.cpu_count() or 1):
        print(f"processor\t: {cpu}\nFeatures\t: {flags}\nCPU implementer\t: 0x00\n")


if __name__ == "__main__":
    main()
