"""PEP 517 backend of plugin-api-cpu-arm-acl: setuptools', with the native build switched on for
wheels only (``setup.py``).

``build_wheel`` (and its metadata) compiles the kernels, so it also asks for the toolchain they
are compiled against: the pinned torch, oneDNN's headers, ninja. An editable install and the
sdist compile nothing and need only setuptools (``make setup`` installs editable).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from setuptools import build_meta

PREBUILT_ENV = "PLUGIN_API_CPU_ARM_ACL_PREBUILT"  # read by setup.py
# torch: the project's pin (the Makefile's); the wheel then requires exactly the torch it found
WHEEL_BUILD_REQUIRES = [
    "torch==2.13.0",
    "ninja>=1.11",
    "onednn-cpu-gomp==2023.2.0; platform_machine == 'x86_64'",
    "onednn-devel-cpu-gomp==2023.2.0; platform_machine == 'x86_64'",
]

build_sdist = build_meta.build_sdist
build_editable = build_meta.build_editable
get_requires_for_build_sdist = build_meta.get_requires_for_build_sdist
get_requires_for_build_editable = build_meta.get_requires_for_build_editable
prepare_metadata_for_build_editable = build_meta.prepare_metadata_for_build_editable


@contextmanager
def _prebuilt() -> Iterator[None]:
    before = os.environ.get(PREBUILT_ENV)
    os.environ[PREBUILT_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PREBUILT_ENV, None)
        else:
            os.environ[PREBUILT_ENV] = before


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return [*build_meta.get_requires_for_build_wheel(config_settings), *WHEEL_BUILD_REQUIRES]


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: dict[str, Any] | None = None
) -> str:
    with _prebuilt():
        return str(build_meta.prepare_metadata_for_build_wheel(metadata_directory, config_settings))


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    with _prebuilt():
        return str(build_meta.build_wheel(wheel_directory, config_settings, metadata_directory))
