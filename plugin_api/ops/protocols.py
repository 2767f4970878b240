"""Each op family's implementation Protocol, and the check the host runs on a plugin's objects.

pluggy checks a hookimpl's argument names when a plugin registers; this does the same for the
objects a plugin's ``plugin_api_implementations`` hook returns: every attribute and method of the
family's Protocol must be there, each method taking the Protocol's parameters by the same names
in the same order (extra parameters only with defaults). A mismatch is refused before any kernel
is asked anything, with the object, the member and the expected signature named.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ..contract import OpFamily
from ..contract.decision import ImplPath
from ..errors import PluginApiError
from .attention import AttentionImplementation
from .gemm import GemmImplementation
from .quant import QuantImplementation
from .state import StateImplementation

Implementation = (
    AttentionImplementation | GemmImplementation | QuantImplementation | StateImplementation
)

PROTOCOLS: dict[OpFamily, type] = {
    OpFamily.ATTENTION: AttentionImplementation,
    OpFamily.GEMM: GemmImplementation,
    OpFamily.QUANT: QuantImplementation,
    OpFamily.STATE: StateImplementation,
}

# the attributes every implementation carries, and what they must hold
_ATTRIBUTES: dict[str, type] = {"name": str, "path": ImplPath}


class ImplementationMismatch(PluginApiError, TypeError):
    """A plugin's implementation object does not follow its op family's Protocol."""


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    """The Protocol's methods and their signatures without ``self``."""
    found = {}
    for name, member in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        sig = inspect.signature(member)
        found[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return found


def _shown(name: str, sig: inspect.Signature) -> str:
    return f"{name}({', '.join(sig.parameters)})"


def _signature_problem(name: str, want: inspect.Signature, method: Any) -> str | None:
    try:
        have = inspect.signature(method)
    except (TypeError, ValueError):
        return None  # a builtin or extension callable without a signature: nothing to compare
    params = list(have.parameters.values())
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.VAR_KEYWORD in kinds:
        return None  # takes anything
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    expected = list(want.parameters)
    got = [p.name for p in named[: len(expected)]]
    extra = [p.name for p in named[len(expected) :] if p.default is inspect.Parameter.empty]
    if got != expected or extra:
        return f"{name} takes ({', '.join(p.name for p in named)}); expected {_shown(name, want)}"
    return None


def mismatches(family: OpFamily, impl: object) -> list[str]:
    """What ``impl`` lacks or gets wrong against ``family``'s Protocol (empty: it conforms)."""
    problems = []
    for attr, kind in _ATTRIBUTES.items():
        if not hasattr(impl, attr):
            problems.append(f"lacks attribute {attr}: {kind.__name__}")
        elif not isinstance(getattr(impl, attr), kind):
            value = getattr(impl, attr)
            problems.append(f"{attr} is {type(value).__name__} {value!r}, not {kind.__name__}")
    for name, want in _methods(PROTOCOLS[family]).items():
        method = getattr(impl, name, None)
        if method is None:
            problems.append(f"lacks method {_shown(name, want)}")
        elif not callable(method):
            problems.append(f"{name} is {type(method).__name__}, not a method")
        else:
            wrong = _signature_problem(name, want, method)
            if wrong:
                problems.append(wrong)
    return problems


def checked(backend_id: str, family: OpFamily, impls: Sequence[object]) -> tuple[Any, ...]:
    """``impls`` as a tuple once each follows ``family``'s Protocol; else a clear error."""
    if isinstance(impls, str | bytes) or not isinstance(impls, Sequence):
        raise ImplementationMismatch(
            f"{backend_id}: plugin_api_implementations({family}) returned "
            f"{type(impls).__name__}, not a sequence of implementations",
            backend=backend_id,
        )
    lines = []
    for impl in impls:
        label = f"{type(impl).__module__}.{type(impl).__qualname__}"
        lines += [f"{label}: {p}" for p in mismatches(family, impl)]
    if lines:
        protocol = PROTOCOLS[family]
        raise ImplementationMismatch(
            f"{backend_id}: {family} implementation(s) do not follow "
            f"{protocol.__module__}.{protocol.__name__}: " + "; ".join(lines),
            backend=backend_id,
            reasons=tuple(lines),
        )
    return tuple(impls)
