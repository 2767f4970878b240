"""Building the extension: cache key, cache reuse, headers and library agree."""

from __future__ import annotations

import dataclasses

import pytest

from plugin_api_cpu_arm_acl import build
from plugin_api_cpu_arm_acl.locate import OneDnnNotFound, locate


@pytest.fixture(scope="module")
def onednn():
    try:
        return locate(None)
    except OneDnnNotFound as e:
        pytest.skip(str(e))


def test_key_changes_with_torch_and_onednn(onednn):
    key = build.build_key(onednn, "2.13.0")
    assert key == build.build_key(onednn, "2.13.0")
    assert key != build.build_key(onednn, "2.14.0")
    assert key != build.build_key(dataclasses.replace(onednn, version="3.9.0"), "2.13.0")


def test_loaded_extension_is_cached_and_reports_its_onednn(onednn_backend):
    ext = build.extension()
    assert build.extension() is ext
    assert ext.ops.onednn_version() == ext.onednn.version
    assert (ext.build_dir / f"{build.NAMESPACE}_{ext.build_dir.name}.so").exists()
