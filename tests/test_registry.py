"""Discovery and loading through real installed distributions, failure by failure."""

from __future__ import annotations

import sys

import pytest

from plugin_api.registry import load_plugins
from plugin_api.selection import select
from plugin_api.settings import Settings

from .distributions import write_plugin

FAST = Settings(probe_timeout=1.0)


def records(settings: Settings = FAST):
    reg = load_plugins(settings)
    return {(r.id, r.distribution): r for r in reg.records}, reg


def test_good_fixture_plugin_loads_and_probes(site, clean_env):
    write_plugin(site, dist="fx-good", backend_id="fx-good", package="fx_good")
    recs, reg = records()
    r = recs[("fx-good", "fx-good")]
    assert r.state == "validated" and r.failure is None
    assert r.reasons == ("fixture says validated",)
    assert "fx-good" in reg.managers


def test_import_error_is_recorded_with_traceback(site, clean_env):
    write_plugin(
        site,
        dist="fx-broken",
        backend_id="fx-broken",
        package="fx_broken",
        descriptor="import fx_no_such_module_xyz\n",
    )
    recs, _ = records()
    r = recs[("fx-broken", "fx-broken")]
    assert r.state == "failed"
    assert r.failure.stage == "describe"
    assert r.failure.message == "ModuleNotFoundError: No module named 'fx_no_such_module_xyz'"
    assert "fx_broken/descriptor.py" in r.failure.traceback
    # the other plugins are unaffected
    assert recs[("reference", "plugin-api")].state == "validated"


def test_probe_that_raises(site, clean_env):
    hooks = """
from plugin_api import hookimpl
@hookimpl
def plugin_api_probe(info):
    raise RuntimeError("sensor on fire")
@hookimpl
def plugin_api_implementations(family):
    return ()
"""
    write_plugin(site, dist="fx-raise", backend_id="fx-raise", package="fx_raise", hooks=hooks)
    r = records()[0][("fx-raise", "fx-raise")]
    assert r.failure.stage == "probe"
    assert r.failure.message == "RuntimeError: sensor on fire"
    assert "raise RuntimeError" in r.failure.traceback


def test_probe_that_hangs_is_bounded(site, clean_env):
    hooks = """
import time
from plugin_api import hookimpl
@hookimpl
def plugin_api_probe(info):
    time.sleep(30)
@hookimpl
def plugin_api_implementations(family):
    return ()
"""
    write_plugin(site, dist="fx-hang", backend_id="fx-hang", package="fx_hang", hooks=hooks)
    recs, _ = records(Settings(probe_timeout=0.3))
    r = recs[("fx-hang", "fx-hang")]
    assert r.failure.stage == "probe"
    assert r.failure.message.startswith("did not finish within 0.3 s (PLUGIN_API_PROBE_TIMEOUT)")
    assert "time.sleep(30)" in r.failure.traceback  # where it was stuck
    assert r.seconds < 5


def test_host_api_mismatch_is_refused_before_plugin_code(site, clean_env):
    write_plugin(
        site, dist="fx-future", backend_id="fx-future", package="fx_future", host_api=">=2,<3"
    )
    r = records()[0][("fx-future", "fx-future")]
    assert r.failure.stage == "compat"
    assert r.failure.message == (
        "plugin 'fx-future' supports host API >=2,<3; this host (plugin-api 0.1.0) provides "
        "API 1.0. Install a fx-future release built for API 1.0 (no plugin code beyond its "
        "descriptor was imported)."
    )
    assert "fx_future.hooks" not in sys.modules


def test_hookimpl_with_wrong_signature(site, clean_env):
    hooks = """
from plugin_api import hookimpl
@hookimpl
def plugin_api_probe(info, device):
    return None
@hookimpl
def plugin_api_implementations(family):
    return ()
"""
    write_plugin(site, dist="fx-sig", backend_id="fx-sig", package="fx_sig", hooks=hooks)
    r = records()[0][("fx-sig", "fx-sig")]
    assert r.failure.stage == "register"
    assert r.failure.message.startswith("PluginValidationError: Plugin 'fx-sig' for hook")
    assert "plugin_api_probe" in r.failure.message and "device" in r.failure.message


def test_missing_required_hook(site, clean_env):
    hooks = """
from plugin_api import Availability, hookimpl
@hookimpl
def plugin_api_probe(info):
    return Availability.unavailable("x")
"""
    write_plugin(site, dist="fx-half", backend_id="fx-half", package="fx_half", hooks=hooks)
    r = records()[0][("fx-half", "fx-half")]
    assert r.failure.stage == "register"
    assert "does not implement required hook(s): plugin_api_implementations" in r.failure.message


def test_unknown_hook_name_is_an_error(site, clean_env):
    hooks = """
from plugin_api import Availability, hookimpl
@hookimpl
def plugin_api_probe(info):
    return Availability.unavailable("x")
@hookimpl
def plugin_api_implementations(family):
    return ()
@hookimpl
def plugin_api_probe_v2(info):
    return None
"""
    write_plugin(site, dist="fx-extra", backend_id="fx-extra", package="fx_extra", hooks=hooks)
    r = records()[0][("fx-extra", "fx-extra")]
    assert r.failure.stage == "register"
    assert "plugin_api_probe_v2" in r.failure.message


def test_two_distributions_claim_one_id(site, clean_env):
    write_plugin(site, dist="fx-one", backend_id="fx-same", package="fx_one")
    write_plugin(site, dist="fx-two", backend_id="fx-same", package="fx_two", version="2.0")
    recs, reg = records()
    a, b = recs[("fx-same", "fx-one")], recs[("fx-same", "fx-two")]
    for r in (a, b):
        assert r.failure.stage == "discover"
        assert "claimed by 2 distributions: fx-one 1.0 (fx_one.descriptor), fx-two 2.0" in (
            r.failure.message
        )
    assert "fx_one.descriptor" not in sys.modules and "fx_two.descriptor" not in sys.modules
    with pytest.raises(Exception, match="claimed by 2 distributions"):
        select(reg.records, Settings(backend="fx-same"), reg.info)


def test_descriptor_id_must_match_entry_point(site, clean_env):
    write_plugin(site, dist="fx-name", backend_id="fx-name", package="fx_name")
    ep = site / "fx_name-1.0.dist-info" / "entry_points.txt"
    ep.write_text("[plugin_api.backends]\nfx-alias = fx_name.descriptor\n")
    r = records()[0][("fx-alias", "fx-name")]
    assert r.failure.stage == "describe"
    assert "entry point name 'fx-alias' and DESCRIPTOR.id 'fx-name' differ" in r.failure.message


def test_probe_returning_wrong_type(site, clean_env):
    hooks = """
from plugin_api import hookimpl
@hookimpl
def plugin_api_probe(info):
    return "validated"
@hookimpl
def plugin_api_implementations(family):
    return ()
"""
    write_plugin(site, dist="fx-type", backend_id="fx-type", package="fx_type", hooks=hooks)
    r = records()[0][("fx-type", "fx-type")]
    assert r.failure.stage == "probe"
    assert "returned str, not Availability" in r.failure.message


def test_allow_list_excludes_without_importing(site, clean_env):
    write_plugin(site, dist="fx-a", backend_id="fx-a", package="fx_a")
    write_plugin(site, dist="fx-b", backend_id="fx-b", package="fx_b")
    recs, _ = records(Settings(plugins=frozenset({"fx-a"}), probe_timeout=1.0))
    assert recs[("fx-a", "fx-a")].state == "validated"
    assert recs[("fx-b", "fx-b")].state == "excluded"
    assert recs[("reference", "plugin-api")].state == "validated"  # the host's own, always
    assert "fx_b.descriptor" not in sys.modules


def test_allow_list_naming_nothing_is_an_error(site, clean_env):
    with pytest.raises(ValueError, match=r"PLUGIN_API_PLUGINS names 'fx-nope', which match no"):
        load_plugins(Settings(plugins=frozenset({"fx-nope"})))


HALF_QUANT_HOOKS = """
from plugin_api import Availability, Status, hookimpl
from plugin_api.contract.decision import Decision, ImplPath
STATUS = "{status}"
class HalfQuant:
    name = "{id}:quant"
    path = ImplPath.TORCH
    def supports(self, spec, info):
        return Decision.accept("fixture")
    {quantize}
@hookimpl
def plugin_api_probe(info):
    if STATUS == "unavailable":
        return Availability.unavailable("fixture says unavailable")
    return Availability(Status(STATUS), ("fixture says " + STATUS,), "cpu")
@hookimpl
def plugin_api_implementations(family):
    return (HalfQuant(),)
"""


def write_half_quant(site, backend_id: str, quantize: str, status: str = "validated") -> None:
    package = backend_id.replace("-", "_")
    fields = {"quantize": quantize}
    write_plugin(
        site,
        dist=backend_id,
        backend_id=backend_id,
        package=package,
        hooks=HALF_QUANT_HOOKS,
        status=status,
        fields=fields,
    )


def test_implementation_lacking_a_protocol_method_is_refused(site, clean_env):
    write_half_quant(site, "fx-lack", quantize="")
    recs, reg = records()
    r = recs[("fx-lack", "fx-lack")]
    assert r.state == "failed" and r.failure.stage == "conform"
    assert r.failure.message == (
        "fx-lack: quant implementation(s) do not follow "
        "plugin_api.ops.quant.QuantImplementation: fx_lack.hooks.HalfQuant: lacks method "
        "quantize(spec, x, eps, out_q, out_scales)"
    )
    assert "fx-lack" not in reg.managers  # never selectable
    with pytest.raises(Exception, match="lacks method quantize"):
        select(reg.records, Settings(backend="fx-lack"), reg.info)


def test_implementation_with_a_mistyped_method_is_refused(site, clean_env):
    write_half_quant(
        site, "fx-typo", quantize="def quantize(self, spec, x, out_q, out_scales): ..."
    )
    r = records()[0][("fx-typo", "fx-typo")]
    assert r.failure.stage == "conform"
    assert r.failure.message.endswith(
        "fx_typo.hooks.HalfQuant: quantize takes (spec, x, out_q, out_scales); expected "
        "quantize(spec, x, eps, out_q, out_scales)"
    )


def test_conforming_implementations_are_checked_once_and_kept(site, clean_env):
    write_half_quant(
        site, "fx-whole", quantize="def quantize(self, spec, x, eps, out_q, out_scales): ..."
    )
    recs, reg = records()
    assert recs[("fx-whole", "fx-whole")].state == "validated"
    from plugin_api.contract import OpFamily

    kept = reg.checked[("fx-whole", OpFamily.QUANT)]
    assert [i.name for i in kept] == ["fx-whole:quant"]
    assert reg.implementations("fx-whole", OpFamily.QUANT) is kept


def test_a_plugin_that_cannot_run_here_is_not_asked_for_implementations(site, clean_env):
    write_half_quant(site, "fx-away", quantize="", status="unavailable")
    recs, reg = records()
    r = recs[("fx-away", "fx-away")]
    assert r.state == "unavailable" and r.failure is None  # its broken object was never built
    assert not any(key[0] == "fx-away" for key in reg.checked)
