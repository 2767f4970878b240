"""``DeviceInfo``: plain data describing the machine a backend would run on.

Probes are pure functions of this data, so tests (and ``plugin-api doctor --device-info``) can ask
"what would be chosen on an H200?" without the hardware. ``read_device_info()`` builds it from the
real machine; it reads library versions from package metadata and never imports them.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

import importlib_metadata

Vendor = Literal["nvidia", "amd", "intel"]

# Distributions whose versions every DeviceInfo records; descriptors may ask for more.
DEFAULT_LIBRARIES = ("torch", "triton", "flashinfer-python", "intel-extension-for-pytorch")


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One accelerator visible to torch.

    ``arch`` is ``sm_90``-style for NVIDIA, the gfx name (``gfx942``) for AMD, and a product
    family for Intel (``pvc`` for Data Center GPU Max, ``bmg``/``dg2`` for Arc).
    """

    vendor: Vendor
    torch_device: str  # the torch device type that reaches it: "cuda" (also ROCm) or "xpu"
    name: str
    arch: str
    memory_bytes: int = 0
    compute_capability: tuple[int, int] | None = None  # NVIDIA only


@dataclass(frozen=True, slots=True)
class TorchBuild:
    """What the installed torch was built for (not what hardware is present)."""

    version: str
    cuda: str | None = None  # torch.version.cuda
    hip: str | None = None  # torch.version.hip
    xpu: bool = False  # built with XPU support


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The machine as probes see it. Construct directly in tests; ``read_device_info()`` in use."""

    machine: str  # platform.machine(): "x86_64", "aarch64"
    cpu_model: str = ""
    cpu_count: int = 1
    cpu_flags: frozenset[str] = frozenset()  # /proc/cpuinfo flags (x86) or Features (Arm)
    torch: TorchBuild | None = None
    accelerators: tuple[Accelerator, ...] = ()
    # distribution name -> installed version, for the libraries probes care about
    libraries: tuple[tuple[str, str], ...] = ()
    system: str = "Linux"
    # free-form facts a plugin reads from the machine (e.g. "onednn.acl": "yes")
    facts: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        # canonical order, so that equal machines compare (and serialise) equal
        object.__setattr__(self, "cpu_flags", frozenset(self.cpu_flags))
        object.__setattr__(self, "libraries", tuple(sorted(self.libraries)))
        object.__setattr__(self, "facts", tuple(sorted(self.facts)))

    def library(self, name: str) -> str | None:
        """Installed version of distribution ``name``, or None when it is not installed."""
        return dict(self.libraries).get(name)

    def fact(self, name: str) -> str | None:
        return dict(self.facts).get(name)

    def accelerators_of(self, vendor: Vendor) -> tuple[Accelerator, ...]:
        return tuple(a for a in self.accelerators if a.vendor == vendor)

    def with_facts(self, extra: dict[str, str]) -> DeviceInfo:
        merged = dict(self.facts) | extra
        return _replace(self, facts=tuple(sorted(merged.items())))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu_flags"] = sorted(self.cpu_flags)
        d["libraries"] = dict(self.libraries)
        d["facts"] = dict(self.facts)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceInfo:
        """Build from JSON data; unknown keys are an error (a typo must not be ignored)."""
        _check_keys("DeviceInfo", data, cls)
        if "machine" not in data:
            raise ValueError('DeviceInfo: \'machine\' is required (e.g. "x86_64" or "aarch64")')
        torch_data = data.get("torch")
        torch = None
        if torch_data is not None:
            _check_keys("DeviceInfo.torch", torch_data, TorchBuild)
            torch = TorchBuild(**torch_data)
        accels = []
        for i, a in enumerate(data.get("accelerators", ())):
            _check_keys(f"DeviceInfo.accelerators[{i}]", a, Accelerator)
            a = dict(a)
            if a.get("compute_capability") is not None:
                a["compute_capability"] = tuple(a["compute_capability"])
            accels.append(Accelerator(**a))
        return cls(
            machine=data["machine"],
            cpu_model=data.get("cpu_model", ""),
            cpu_count=int(data.get("cpu_count", 1)),
            cpu_flags=frozenset(data.get("cpu_flags", ())),
            torch=torch,
            accelerators=tuple(accels),
            libraries=tuple(sorted(dict(data.get("libraries", {})).items())),
            system=data.get("system", "Linux"),
            facts=tuple(sorted(dict(data.get("facts", {})).items())),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> DeviceInfo:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--device-info {path}: cannot read DeviceInfo JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"--device-info {path}: expected a JSON object")
        return cls.from_dict(data)


def _replace(info: DeviceInfo, **changes: Any) -> DeviceInfo:
    values = {f.name: getattr(info, f.name) for f in fields(info)}
    values.update(changes)
    return DeviceInfo(**values)


def _check_keys(where: str, data: Any, cls: type) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys: {sorted(known)}")


# ---- reading the real machine ------------------------------------------------------------------


def read_device_info(libraries: tuple[str, ...] = ()) -> DeviceInfo:
    """Describe this machine. Imports torch (to see its accelerators) and nothing else heavy."""
    model, flags = _read_cpu()
    names = tuple(dict.fromkeys(DEFAULT_LIBRARIES + libraries))
    return DeviceInfo(
        machine=platform.machine(),
        system=platform.system(),
        cpu_model=model,
        cpu_count=os.cpu_count() or 1,
        cpu_flags=flags,
        torch=_read_torch_build(),
        accelerators=_read_accelerators(),
        libraries=tuple(sorted((n, v) for n in names if (v := installed_version(n)) is not None)),
    )


def installed_version(distribution: str) -> str | None:
    try:
        dist = importlib_metadata.distribution(distribution)
    except importlib_metadata.PackageNotFoundError:
        return None
    return dist_name_version(dist)[1]


class _DistributionLike(Protocol):
    """What ``dist_name_version`` reads of a distribution: ``importlib_metadata``'s
    ``Distribution`` and the ``IDistribution`` its entry points carry both have it."""

    def read_text(self, filename: str) -> str | None: ...

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


def dist_name_version(dist: _DistributionLike | None) -> tuple[str, str]:
    """Name and version of a distribution, read from the header lines of its METADATA (or
    PKG-INFO) file: the full email parser costs more than discovering every plugin."""
    if dist is None:
        return "?", "?"
    for filename in ("METADATA", "PKG-INFO"):
        text = dist.read_text(filename)
        if not text:
            continue
        fields: dict[str, str] = {}
        for line in text.splitlines():
            if not line:
                break  # the headers end at the first blank line
            key, _, value = line.partition(":")
            if key in ("Name", "Version") and key not in fields:
                fields[key] = value.strip()
        if len(fields) == 2:
            return fields["Name"], fields["Version"]
    return dist.name, dist.version


def _read_cpu() -> tuple[str, frozenset[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), frozenset()
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    if not model and "asimd" in flags:
        model = _arm_cpu_name(text)
    return model or platform.processor(), flags


def _arm_cpu_name(cpuinfo: str) -> str:
    # Arm cores report a part number, not a name; name the ones plugins care about.
    parts = {
        "0xd0c": "Neoverse-N1",
        "0xd40": "Neoverse-V1",
        "0xd49": "Neoverse-N2",
        "0xd4f": "Neoverse-V2",
        "0xd84": "Neoverse-V3",
        "0xd8e": "Neoverse-N3",
    }
    for line in cpuinfo.splitlines():
        if line.startswith("CPU part"):
            part = line.partition(":")[2].strip()
            return parts.get(part, f"Arm CPU part {part}")
    return "Arm CPU"


def _read_torch_build() -> TorchBuild | None:
    try:
        import torch
    except ImportError:
        return None
    return TorchBuild(
        version=torch.__version__,
        cuda=torch.version.cuda,
        hip=torch.version.hip,
        xpu=bool(getattr(torch._C, "_has_xpu", False)),
    )


def _read_accelerators() -> tuple[Accelerator, ...]:
    try:
        import torch
    except ImportError:
        return ()
    found: list[Accelerator] = []
    if torch.cuda.is_available():
        hip = torch.version.hip is not None
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            if hip:
                arch = str(getattr(p, "gcnArchName", "")).split(":")[0]
                found.append(Accelerator("amd", "cuda", p.name, arch, int(p.total_memory)))
            else:
                cc = (int(p.major), int(p.minor))
                found.append(
                    Accelerator(
                        "nvidia", "cuda", p.name, f"sm_{cc[0]}{cc[1]}", int(p.total_memory), cc
                    )
                )
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for i in range(xpu.device_count()):
            p = xpu.get_device_properties(i)
            found.append(
                Accelerator("intel", "xpu", p.name, intel_gpu_family(p.name), int(p.total_memory))
            )
    return tuple(found)


def intel_gpu_family(name: str) -> str:
    """Product family of an Intel GPU from its marketing name (what torch.xpu reports)."""
    n = name.lower()
    if "max" in n and "data center" in n:
        return "pvc"
    if "arc" in n and any(f"b{d}" in n for d in "5678"):
        return "bmg"
    if "arc" in n:
        return "dg2"
    return "unknown"
