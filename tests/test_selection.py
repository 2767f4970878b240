"""Every row of the selection table (DESIGN.md section 3), as a pure function of records."""

from __future__ import annotations

import pytest

from plugin_api.contract import Availability, BackendDescriptor, OpFamily, Status
from plugin_api.device_info import Accelerator, DeviceInfo, TorchBuild
from plugin_api.errors import (
    AmbiguousSelection,
    BackendNotInstalled,
    BackendUnavailable,
    SelectionError,
    StaleSelection,
)
from plugin_api.registry import Failure, PluginRecord
from plugin_api.selection import Selection, select
from plugin_api.settings import Settings

CPU = DeviceInfo(machine="x86_64", torch=TorchBuild("2.13.0"))


def rec(
    backend_id: str,
    status: str | None,
    priority: int = 20,
    *,
    failure: str | None = None,
    families=(OpFamily.GEMM,),
) -> PluginRecord:
    desc = BackendDescriptor(
        backend_id, ">=1.0,<2", priority, families, ("cpu",), f"{backend_id}.hooks", "test"
    )
    probe = None
    if status == "unavailable":
        probe = Availability.unavailable(f"{backend_id}: no such hardware")
    elif status is not None:
        probe = Availability(Status(status), (f"{backend_id} is {status}",), "cpu")
    return PluginRecord(
        backend_id,
        f"dist-{backend_id}",
        "1.0",
        f"{backend_id}.descriptor",
        desc,
        probe,
        Failure("describe", failure) if failure else None,
    )


REF = rec("reference", "validated", priority=0)


def test_named_validated():
    s = select([REF, rec("a", "validated")], Settings(backend="a"), CPU)
    assert (s.backend, s.status, s.reason, s.notes) == (
        "a",
        Status.VALIDATED,
        "PLUGIN_API_BACKEND",
        (),
    )
    assert [c.chosen for c in s.trace] == [False, True]
    assert s.trace[0].reason == "not requested (PLUGIN_API_BACKEND)"


def test_named_experimental_notes_it():
    s = select([REF, rec("a", "experimental")], Settings(backend="a"), CPU)
    assert s.status is Status.EXPERIMENTAL
    assert s.notes == ("a is experimental on this machine (runs, not validated)",)


def test_named_unknown_lists_installed_and_failed():
    records = [REF, rec("cuda-sm90", "unavailable"), rec("xpu", None, failure="ImportError: x")]
    with pytest.raises(BackendNotInstalled) as e:
        select(records, Settings(backend="cuda-sm9"), CPU)
    assert str(e.value) == (
        "PLUGIN_API_BACKEND='cuda-sm9' is not installed. Installed: cuda-sm90, reference. "
        "Failed to load: xpu (ImportError: x). Did you mean 'cuda-sm90'?"
    )


def test_named_unavailable_gives_probe_reasons():
    with pytest.raises(BackendUnavailable) as e:
        select([REF, rec("a", "unavailable")], Settings(backend="a"), CPU)
    assert "PLUGIN_API_BACKEND='a' is unavailable here (no fallback is made)" in str(e.value)
    assert e.value.reasons == ("a: no such hardware",)


def test_named_failed_gives_failure():
    with pytest.raises(BackendUnavailable, match=r"(?s)failed to load.*describe: boom"):
        select([REF, rec("a", None, failure="boom")], Settings(backend="a"), CPU)


def test_named_without_kernels_is_unavailable():
    with pytest.raises(BackendUnavailable, match="provides no op kernels yet"):
        select([REF, rec("a", "validated", families=())], Settings(backend="a"), CPU)


def test_named_excluded():
    excluded = PluginRecord("a", "dist-a", "1.0", "a.descriptor", excluded=True)
    with pytest.raises(BackendUnavailable, match="excluded by PLUGIN_API_PLUGINS"):
        select([REF, excluded], Settings(backend="a"), CPU)


def test_auto_single_validated():
    s = select([REF, rec("a", "validated"), rec("b", "unavailable")], Settings(), CPU)
    assert s.backend == "a" and s.reason == "auto: the only validated plugin (priority 20)"
    assert {c.id: c.reason for c in s.trace}["reference"] == (
        "portable fallback; a validated plugin was found"
    )


def test_auto_highest_priority_wins():
    s = select([REF, rec("a", "validated", 10), rec("b", "validated", 30)], Settings(), CPU)
    assert s.backend == "b"
    assert {c.id: c.reason for c in s.trace}["a"] == "lower priority (10 < 30)"


def test_auto_equal_priority_is_an_error_naming_them():
    with pytest.raises(AmbiguousSelection) as e:
        select([REF, rec("a", "validated"), rec("b", "validated")], Settings(), CPU)
    assert "share the top priority 20: a, b. Set PLUGIN_API_BACKEND" in str(e.value)


def test_auto_experimental_is_not_chosen_but_noted():
    s = select([REF, rec("a", "experimental")], Settings(), CPU)
    assert s.backend == "reference"
    assert "a is experimental here; PLUGIN_API_BACKEND=a selects it" in s.notes


@pytest.mark.parametrize(
    "info,hint",
    [
        (CPU, "no plugin targets this machine (x86_64 CPU, no accelerator) as validated"),
        (
            DeviceInfo("x86_64", accelerators=(Accelerator("nvidia", "cuda", "H200", "sm_90"),)),
            "this machine suits cuda-sm90: pip install plugin-api-cuda-sm90",
        ),
        (
            DeviceInfo("aarch64"),
            "this machine suits cpu-arm-acl: pip install plugin-api-cpu-arm-acl",
        ),
    ],
)
def test_auto_none_validated_falls_to_reference_with_install_note(info, hint):
    s = select([REF, rec("a", "unavailable")], Settings(), info)
    assert s.backend == "reference" and s.reason == "auto: no plugin is validated here"
    assert s.notes[0].startswith(hint)


def test_install_note_names_an_installed_but_unusable_plugin():
    h200 = DeviceInfo("x86_64", accelerators=(Accelerator("nvidia", "cuda", "H200", "sm_90"),))
    s = select([REF, rec("cuda-sm90", "unavailable")], Settings(), h200)
    assert s.notes[0] == "cuda-sm90 is installed but unavailable here: cuda-sm90: no such hardware"


def test_nothing_runs_at_all():
    with pytest.raises(SelectionError, match="not even the reference"):
        select([rec("reference", "unavailable", 0)], Settings(), CPU)


def test_selection_round_trips_through_json():
    s = select([REF, rec("a", "validated")], Settings(strict=True), CPU)
    assert Selection.from_json(s.to_json()) == s


def test_garbage_serialised_selection():
    with pytest.raises(StaleSelection, match="not a serialised selection"):
        Selection.from_json('{"backend": "a"}')
