"""Every PLUGIN_API_* variable: values, empty values, unknown names."""

from __future__ import annotations

import pytest

from plugin_api.errors import SettingError
from plugin_api.settings import DEFAULT_PROBE_TIMEOUT, Settings, check_names, read_settings


def test_defaults():
    assert read_settings({}) == Settings()
    assert read_settings({"PLUGIN_API_BACKEND": "auto"}).backend is None


def test_values():
    s = read_settings(
        {
            "PLUGIN_API_BACKEND": "xpu",
            "PLUGIN_API_STRICT": "1",
            "PLUGIN_API_PLUGINS": "xpu, rocm",
            "PLUGIN_API_PROBE_TIMEOUT": "2.5",
            "PLUGIN_API_SELECTION": "{}",
        }
    )
    assert s == Settings("xpu", True, frozenset({"xpu", "rocm"}), 2.5, "{}")
    assert read_settings({"PLUGIN_API_STRICT": "false"}).strict is False
    assert read_settings({}).probe_timeout == DEFAULT_PROBE_TIMEOUT


@pytest.mark.parametrize(
    "name",
    [
        "PLUGIN_API_BACKEND",
        "PLUGIN_API_STRICT",
        "PLUGIN_API_PLUGINS",
        "PLUGIN_API_PROBE_TIMEOUT",
        "PLUGIN_API_SELECTION",
        "PLUGIN_API_ONEDNN_ROOT",
    ],
)
@pytest.mark.parametrize("value", ["", "  "])
def test_empty_values_are_errors(name, value):
    with pytest.raises(SettingError, match=f"^{name} is set but empty; unset it or give a value$"):
        read_settings({name: value})


@pytest.mark.parametrize(
    "env,message",
    [
        ({"PLUGIN_API_STRICT": "maybe"}, "PLUGIN_API_STRICT='maybe' is not a boolean; use 1 or 0"),
        (
            {"PLUGIN_API_PROBE_TIMEOUT": "soon"},
            "PLUGIN_API_PROBE_TIMEOUT='soon' must be a positive",
        ),
        ({"PLUGIN_API_PROBE_TIMEOUT": "-1"}, "PLUGIN_API_PROBE_TIMEOUT='-1' must be a positive"),
        ({"PLUGIN_API_PROBE_TIMEOUT": "nan"}, "PLUGIN_API_PROBE_TIMEOUT='nan' must be a positive"),
        ({"PLUGIN_API_PLUGINS": "xpu,,rocm"}, "PLUGIN_API_PLUGINS='xpu,,rocm' has an empty entry"),
    ],
)
def test_invalid_values(env, message):
    with pytest.raises(SettingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_settings(env)


def test_unknown_name_with_suggestion():
    with pytest.raises(SettingError) as e:
        check_names({"PLUGIN_API_BACKNED": "xpu"}, known=())
    assert str(e.value).startswith(
        "PLUGIN_API_BACKNED is not a plugin-api setting. Did you mean PLUGIN_API_BACKEND?"
    )


def test_plugin_declared_names_are_known():
    check_names({"PLUGIN_API_ONEDNN_ROOT": "/opt/dnnl"}, known=("PLUGIN_API_ONEDNN_ROOT",))
    with pytest.raises(SettingError, match="PLUGIN_API_ONEDNN_ROOT is not a plugin-api setting"):
        check_names({"PLUGIN_API_ONEDNN_ROOT": "/opt/dnnl"}, known=())


def test_other_prefixes_are_not_ours():
    check_names({"PLUGIN_APIX": "1", "VLLM_PLUGINS": "x"}, known=())
