"""Turn a fuzz case (plain data, ``strategies.py``) into live arguments and the calls to make.

Every tensor the caller owns is allocated inside a larger byte buffer with guard bytes on both
sides (``GUARD``, filled with ``SENTINEL``), so that a kernel writing past a tensor's end changes
bytes the worker compares (``worker.py``). A case becomes a ``Built``: its named arguments, the
steps of the public API it calls in order (``attention`` -> ``plan`` -> ``run``; ``prepare`` ->
``mm``; one call for the others), which arguments each step may write, and a description.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

GUARD = 64  # bytes before and after every tensor the caller owns
SENTINEL = 0xA5


class Inapplicable(Exception):
    """A mutation that does not apply to this case (its argument is absent or not a tensor)."""


def dtype_of(name: str) -> torch.dtype:
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return d


def decode(v: Any) -> Any:
    """A value from the case's JSON, with the tagged strings (``strategies.py``) decoded."""
    if isinstance(v, str) and v.startswith("@"):
        tag = v[1:]
        if tag in ("nan", "inf", "-inf"):
            return float(tag)
        if tag.startswith("dtype:"):
            return dtype_of(tag.removeprefix("dtype:"))
        if tag == "str":
            return "8"
    return v


class Alloc:
    """Guarded tensors with seeded random contents."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.device = device

    def raw(self, nbytes: int, device: torch.device | None = None) -> torch.Tensor:
        size = GUARD + (nbytes + 63) // 64 * 64 + GUARD
        return torch.full((size,), SENTINEL, dtype=torch.uint8, device=device or self.device)

    def empty(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None
    ) -> torch.Tensor:
        es = torch.empty((), dtype=dtype).element_size()
        n = math.prod(shape)
        return self.raw(n * es, device)[GUARD : GUARD + n * es].view(dtype).view(shape)

    def random(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None
    ) -> torch.Tensor:
        t = self.empty(shape, dtype, device)
        t.copy_(self.values(shape, dtype))
        return t

    def values(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=self.gen).bool()
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, generator=self.gen).to(dtype)
        return torch.randint(-5, 6, shape, generator=self.gen).to(dtype)

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s values in a fresh guarded contiguous tensor."""
        out = self.empty(tuple(t.shape), t.dtype, t.device)
        out.copy_(t)
        return out

    def randint(self, hi: int) -> int:
        return int(torch.randint(0, max(hi, 1), (1,), generator=self.gen))


@dataclass
class Step:
    op: str  # the public op this call is (``attention.plan``, ``mm``, ...)
    call: Callable[[], Any]
    writes: Callable[[], list[str]]  # the arguments the call may write when it succeeds
    names: tuple[str, ...]  # the argument names a clean error may name


@dataclass
class Built:
    case: dict[str, Any]
    args: dict[str, Any]  # named arguments: tensors, scalars, structures
    steps: list[Step]
    notes: list[str] = field(default_factory=list)  # mutations that did not apply

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, v in self.args.items():
            if isinstance(v, torch.Tensor):
                yield name, v

    def describe(self) -> str:
        lines = [f"{self.case['kind']} seed={self.case['seed']}"]
        for name, v in self.args.items():
            lines.append(f"  {name} = {show(v, self.args)}")
        for m in self.case["mutations"]:
            lines.append(f"  mutation {m}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def show(v: Any, args: dict[str, Any] | None = None) -> str:
    if isinstance(v, torch.Tensor):
        s = (
            f"tensor {str(v.dtype).removeprefix('torch.')}{list(v.shape)} "
            f"strides={v.stride()} device={v.device}"
        )
        if v.device.type != "meta" and v.numel():
            st = v.untyped_storage()
            s += f" offset={v.storage_offset()}"
            for other_name, other in (args or {}).items():
                if (
                    isinstance(other, torch.Tensor)
                    and other is not v
                    and other.device == v.device
                    and other.device.type != "meta"
                    and other.numel()
                    and other.untyped_storage().data_ptr() == st.data_ptr()
                ):
                    s += f" shares-buffer-with={other_name}"
            if v.numel() <= 16 and not v.dtype.is_floating_point:
                s += f" values={v.tolist()}"
            elif v.dtype.is_floating_point and v.dtype.itemsize >= 2:
                f = v.float()
                if not bool(torch.isfinite(f).all()):
                    s += f" non-finite={int((~torch.isfinite(f)).sum())}"
        return s
    if isinstance(v, list | tuple) and any(isinstance(x, torch.Tensor) for x in v):
        return type(v).__name__ + "[" + ", ".join(show(x) for x in v) + "]"
    return repr(v)


# ---- generic mutations ---------------------------------------------------------------------


def _tensor(args: dict[str, Any], slot: str) -> torch.Tensor:
    t = args.get(slot)
    if not isinstance(t, torch.Tensor):
        raise Inapplicable(f"{slot} is {type(t).__name__}, not a tensor")
    return t


def _pick(frac: int, n: int) -> int:
    return frac % n if n else 0


def _special(value: str, t: torch.Tensor, oob: int) -> float | int | bool:
    d = t.dtype
    if d == torch.bool:
        return value not in ("0", "min")
    if d.is_floating_point:
        info = torch.finfo(d)
        table: dict[str, float] = {
            "nan": math.nan,
            "inf": math.inf,
            "-inf": -math.inf,
            "max": info.max,
            "min": info.min,
            "huge": info.max,
            "oob": min(float(oob), info.max),
        }
        return table.get(value, float(value) if value.lstrip("-").isdigit() else 0.0)
    ii = torch.iinfo(d)
    ints = {"max": ii.max, "min": ii.min, "huge": ii.max, "oob": min(oob, ii.max)}
    if value in ints:
        return ints[value]
    if value.lstrip("-").isdigit():
        return max(min(int(value), ii.max), ii.min)
    return 0  # nan/inf in an integer tensor


def mutate_tensor(
    m: dict[str, Any], args: dict[str, Any], alloc: Alloc, oob: dict[str, int]
) -> None:
    """Apply one generic mutation to ``args`` in place."""
    kind, slot = m["m"], m.get("slot", "")
    if kind == "alias":
        _alias(m, args, alloc)
        return
    t = _tensor(args, slot)
    if t.device.type == "meta" and kind not in ("replace", "device"):
        raise Inapplicable(f"{slot} is on the meta device")
    shape = tuple(t.shape)
    if kind == "dtype":
        args[slot] = alloc.copy(t.to(dtype_of(m["dtype"])))
    elif kind == "rank":
        if m["up"]:
            args[slot] = t.unsqueeze(_pick(m["dim"], t.dim() + 1))
        elif t.dim() >= 2:
            args[slot] = t.flatten(0, 1)
        elif t.numel():
            args[slot] = t.view(-1)[0]  # a 0-dim view
        else:
            raise Inapplicable(f"{slot} is empty and 1-D")
    elif kind in ("size", "zero"):
        if not t.dim():
            raise Inapplicable(f"{slot} has no dims")
        d = _pick(m["dim"], t.dim())
        new = list(shape)
        new[d] = 0 if kind == "zero" else max(0, new[d] + m["delta"])
        args[slot] = alloc.random(tuple(new), t.dtype, t.device)
    elif kind == "strided":
        args[slot] = _strided(t, m["how"], m["dim"], alloc)
    elif kind == "device":
        # another device the op does not run on: the backend's and the CPU swap; else meta
        gpu = alloc.device.type not in ("cpu", "meta")
        if t.device.type == "meta":
            args[slot] = alloc.random(shape, t.dtype, alloc.device)
        elif gpu:
            args[slot] = alloc.copy(t.to("cpu" if t.device.type != "cpu" else alloc.device))
        else:
            args[slot] = t.to("meta")
    elif kind == "replace":
        args[slot] = {
            "none": None,
            "list": t.tolist() if t.device.type != "meta" else [1, 2],
            "int": 3,
            "float": 1.5,
            "str": slot,
        }[m["with"]]
    elif kind == "set":
        _set(m, slot, t, alloc, oob)
    else:
        raise ValueError(f"unknown mutation {kind!r}")


def _strided(t: torch.Tensor, how: str, dim: int, alloc: Alloc) -> torch.Tensor:
    """A view with ``t``'s shape and values but other strides."""
    if not t.dim():
        raise Inapplicable("a 0-dim tensor has no strides")
    shape = tuple(t.shape)
    d = _pick(dim, t.dim())
    if how == "step":  # every other element along ``d``
        big = list(shape)
        big[d] *= 2
        v = alloc.empty(tuple(big), t.dtype, t.device)
        v = v[(slice(None),) * d + (slice(None, None, 2),)]
    elif how == "pad_last":  # rows further apart than they are long
        big = list(shape)
        big[-1] += 5
        v = alloc.empty(tuple(big), t.dtype, t.device)[..., : shape[-1]]
    elif how == "permute":  # stored in another dim order
        order = list(range(t.dim()))
        order = order[d:] + order[:d]
        if t.dim() >= 2 and order == list(range(t.dim())):
            order = order[::-1]
        stored = alloc.empty(tuple(shape[i] for i in order), t.dtype, t.device)
        inverse = [order.index(i) for i in range(t.dim())]
        v = stored.permute(inverse)
    elif how == "expand":  # one row seen many times (stride 0)
        row = alloc.copy(t.narrow(d, 0, min(1, shape[d])))
        return row.expand(shape) if shape[d] else row
    else:
        raise ValueError(f"unknown strided mutation {how!r}")
    v.copy_(t)
    return v


def _set(m: dict[str, Any], slot: str, t: torch.Tensor, alloc: Alloc, oob: dict[str, int]) -> None:
    if not t.numel():
        raise Inapplicable(f"{slot} is empty")
    flat = t.view(-1) if t.is_contiguous() else None
    if flat is None:
        raise Inapplicable(f"{slot} is not contiguous")
    i = _pick(m["at"], flat.numel())
    if m["value"] == "dup":
        if flat.numel() < 2:
            raise Inapplicable(f"{slot} has one element")
        flat[i] = flat[(i + 1) % flat.numel()].clone()
        return
    v = _special(m["value"], t, oob.get(slot, 10**6))
    try:
        if m["all"]:
            flat.fill_(v)
        else:
            flat[i] = v
    except RuntimeError as e:  # inf in a dtype without one (fp8 e4m3)
        raise Inapplicable(f"{slot}.dtype={t.dtype} cannot hold {v}") from e


def _alias(m: dict[str, Any], args: dict[str, Any], alloc: Alloc) -> None:
    """Put ``pair[0]`` in one buffer with ``pair[1]``: at its start (``same``), half way in,
    just past its end (``end``: disjoint) or one element in."""
    a_name, b_name = m["pair"]
    a, b = _tensor(args, a_name), _tensor(args, b_name)
    if a.device.type == "meta" or b.device.type == "meta":
        raise Inapplicable("meta tensors share no memory")
    a_bytes, b_bytes = a.numel() * a.element_size(), b.numel() * b.element_size()
    align = max(a.element_size(), b.element_size(), 8)
    at = {"same": 0, "half": b_bytes // 2, "end": b_bytes, "one": b.element_size()}[m["at"]]
    at = at // align * align
    raw = alloc.raw(max(b_bytes, at + a_bytes), b.device)
    nb = raw[GUARD : GUARD + b_bytes].view(b.dtype).view(tuple(b.shape))
    nb.copy_(b)
    na = raw[GUARD + at : GUARD + at + a_bytes].view(a.dtype).view(tuple(a.shape))
    if a_name not in ("out", "out_scales"):  # an input keeps its values where it can
        na.copy_(a)
    args[a_name], args[b_name] = na, nb


# ---- the cases of each op ------------------------------------------------------------------

GENERIC = frozenset(
    {"dtype", "rank", "size", "zero", "strided", "device", "replace", "set", "alias"}
)


@dataclass
class Context:
    case: dict[str, Any]
    backend: Any
    alloc: Alloc
    args: dict[str, Any]
    make: Callable[[str], Any]  # a fresh valid value of an optional argument
    oob: dict[str, int] = field(default_factory=dict)  # an out-of-range value per argument
    flags: dict[str, str] = field(default_factory=dict)  # the op-specific mutations' choices
    notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # results of earlier steps

    def mutate(self) -> None:
        for m in self.case["mutations"]:
            try:
                self._apply(m)
            except Inapplicable as e:
                self.notes.append(f"{m['m']} skipped: {e}")

    def _apply(self, m: dict[str, Any]) -> None:
        kind = m["m"]
        if kind in GENERIC:
            mutate_tensor(m, self.args, self.alloc, self.oob)
        elif kind == "toggle":
            slot = m["slot"]
            self.args[slot] = self.make(slot) if self.args.get(slot) is None else None
        elif kind == "param":
            name, value = m["name"], decode(m["value"])
            if name.startswith("spec."):
                self.args["spec"][name.removeprefix("spec.")] = value
            else:
                self.args[name] = value
        else:
            self.flags[kind] = m["which"]


def build(case: dict[str, Any], backend: Any) -> Built:
    """Live arguments and steps for ``case`` on ``backend`` (a ``plugin_api.Backend``)."""
    alloc = Alloc(int(case["seed"]), backend.device)
    return BUILDERS[case["kind"]](case, backend, alloc)


def _finish(ctx: Context, steps: list[Step]) -> Built:
    ctx.mutate()
    return Built(ctx.case, ctx.args, steps, ctx.notes)


# ---- attention: attention(spec) -> plan(batch) -> run(...) ---------------------------------

_SPEC_DTYPES = ("dtype", "kv_cache_dtype", "query_dtype")


def _attention(case: dict[str, Any], be: Any, alloc: Alloc) -> Built:
    from ..conformance.cases import make_case
    from ..ops.attention import AttentionBatch, AttentionSpec, KVCache, attention, validate_batch

    b = case["base"]
    spec_kw: dict[str, Any] = {
        k: (dtype_of(v) if k in _SPEC_DTYPES and v is not None else v) for k, v in b["spec"].items()
    }
    spec = AttentionSpec(**spec_kw)

    def paged(lens: dict[str, Any], seed: int) -> Any:
        return make_case(
            spec,
            lens["query_lens"],
            lens["seq_lens"],
            num_decodes=lens["num_decodes"],
            device=be.device,
            seed=seed,
            pad_rows=b["pad_rows"],
            skip_tokens=(0,) if b["skip"] else (),
            k_scale=b["scales"][0],
            v_scale=b["scales"][1],
        )

    pc = paged(b["batch"], int(case["seed"]))
    batch = pc.batch
    num_blocks = pc.cache.num_blocks
    used = validate_batch(spec, batch)

    def copy(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else alloc.copy(t)

    args: dict[str, Any] = {
        "spec": dict(spec_kw),
        "query": copy(pc.query),
        "key": copy(pc.key),
        "value": copy(pc.value),
        "kv_cache.data": copy(pc.cache.data),
        "kv_cache.k_scale": pc.cache.k_scale,
        "kv_cache.v_scale": pc.cache.v_scale,
        "sinks": copy(pc.sinks),
        "out": alloc.empty(tuple(pc.query.shape), spec.dtype) if b["out"] else None,
        "batch.query_start_loc": copy(batch.query_start_loc),
        "batch.seq_lens": copy(batch.seq_lens),
        "batch.block_table": copy(batch.block_table),
        "batch.slot_mapping": copy(batch.slot_mapping),
        "batch.num_decodes": batch.num_decodes,
        "num_blocks": num_blocks if b["num_blocks"] else None,
    }
    rows = int(pc.query.shape[0])

    def make(slot: str) -> Any:
        if slot == "sinks":
            return alloc.random((spec.num_heads,), torch.float32)
        if slot == "out":
            return alloc.empty((rows, spec.num_heads, spec.head_size), spec.dtype)
        return alloc.random((rows, spec.num_kv_heads, spec.head_size), spec.dtype)

    ctx = Context(case, be, alloc, args, make)
    bs = spec.block_size
    ctx.oob = {
        "batch.block_table": num_blocks,
        "batch.slot_mapping": num_blocks * bs,
        "batch.seq_lens": int(batch.block_table.shape[1]) * bs + 1,
        "batch.query_start_loc": rows + 1,
        "kv_cache.data": 1000,
    }
    special = {"@exact": num_blocks, "@used": max(used, 0)}
    st = ctx.state

    def spec_now() -> AttentionSpec:
        return AttentionSpec(**{k: decode(v) for k, v in args["spec"].items()})

    def other(which: str, batch: Any) -> Any:
        """A plan made elsewhere: another spec's, the reference's, another batch's."""
        attn = st["attn"]
        if which == "other_spec":
            s = attn.spec
            changed = AttentionSpec(**{**_fields(s), "scale": s.softmax_scale * 0.5})
            return attention(changed, be).plan(batch)
        if which == "reference":
            from ..backend import backend_for

            return attention(attn.spec, backend_for("reference")).plan(batch)
        if which == "other_batch":
            return attn.plan(paged(b["other_batch"], int(case["seed"]) + 1).batch)
        if which == "same":
            return attn.plan(batch)
        if which == "not_plan":
            return batch
        return None

    def batch_now() -> Any:
        how = ctx.flags.get("batch_type")
        fields = {
            f: args[f"batch.{f}"]
            for f in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
        }
        if how == "dict":
            return {**fields, "num_decodes": args["batch.num_decodes"]}
        if how == "none":
            return None
        if how == "tuple":
            return (*fields.values(), args["batch.num_decodes"])
        return AttentionBatch(**fields, num_decodes=args["batch.num_decodes"])

    def do_attention() -> None:
        st["attn"] = attention(spec_now(), be)

    def do_plan() -> None:
        batch = batch_now()
        reuse = other(ctx.flags["reuse"], batch) if "reuse" in ctx.flags else None
        nb = args["num_blocks"]
        nb = special.get(nb, nb) if isinstance(nb, str) else nb
        st["plan"] = st["attn"].plan(batch, reuse=reuse, num_blocks=nb)

    def do_run() -> None:
        plan = st["plan"]
        if "plan_of" in ctx.flags:
            plan = other(ctx.flags["plan_of"], batch_now())
        cache: Any = KVCache(
            args["kv_cache.data"], args["kv_cache.k_scale"], args["kv_cache.v_scale"]
        )
        how = ctx.flags.get("kv_cache_type")
        if how == "tensor":
            cache = args["kv_cache.data"]
        elif how == "dict":
            cache = {"data": args["kv_cache.data"]}
        elif how == "none":
            cache = None
        st["attn"].run(
            args["query"],
            args["key"],
            args["value"],
            cache,
            plan,
            sinks=args["sinks"],
            out=args["out"],
        )

    def run_writes() -> list[str]:
        return ["out"] if st["attn"].spec.kv_sharing else ["out", "kv_cache.data"]

    spec_names = ("spec", *_fields(spec))
    batch_names = ("batch", "num_blocks", "reuse", *(k for k in args if k.startswith("batch.")))
    run_names = (
        "query", "key", "value", "kv_cache", "kv_cache.data", "kv_cache.k_scale",
        "kv_cache.v_scale", "plan", "sinks", "out",
    )  # fmt: skip
    steps = [
        Step("attention", do_attention, list, spec_names),
        Step("attention.plan", do_plan, list, batch_names),
        Step("attention.run", do_run, run_writes, run_names),
    ]
    return _finish(ctx, steps)


def _fields(spec: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(spec, f.name) for f in fields(spec)}


# ---- GEMM: prepare(weight) -> mm / scaled_mm -----------------------------------------------


def _gemm(case: dict[str, Any], be: Any, alloc: Alloc) -> Built:
    from ..ops.gemm import mm, prepare, scaled_mm

    b = case["base"]
    scaled = case["kind"] == "scaled_mm"
    m, n, k = b["m"], b["n"], b["k"]
    wdt = torch.int8 if scaled else dtype_of(b["dtype"])
    out_dtype = None if b["out_dtype"] is None else dtype_of(b["out_dtype"])
    eff = out_dtype or (torch.bfloat16 if scaled else wdt)
    xname = "x_q" if scaled else "x"

    def int8(shape: tuple[int, ...]) -> torch.Tensor:
        t = alloc.empty(shape, torch.int8)
        t.copy_(torch.randint(-127, 128, shape, generator=alloc.gen).to(torch.int8))
        return t

    def scales(shape: tuple[int, ...]) -> torch.Tensor:
        t = alloc.empty(shape, torch.float32)
        t.copy_(torch.rand(shape, generator=alloc.gen) * 0.1 + 1e-3)
        return t

    x = int8((m, k)) if scaled else alloc.random((m, k), wdt)
    if b["row_pad"]:
        x = _strided(x, "pad_last", 0, alloc)
    bias_dtype = {None: None, "w": wdt, "out": eff, "float32": torch.float32}[b["bias"]]

    def make(slot: str) -> Any:
        if slot == "bias":
            return alloc.random((n,), bias_dtype or eff)
        if slot == "out":
            return alloc.empty((m, n), eff)
        return scales((n,))

    args: dict[str, Any] = {
        "weight": int8((n, k)) if scaled else alloc.random((n, k), wdt),
        "weight_scale": scales((n,)) if scaled else None,
        "out_dtype": out_dtype,
        "usage": b["usage"],
        xname: x,
    }
    if scaled:
        args["x_scale"] = scales((m, 1) if b["scale_2d"] else (m,))
    args["bias"] = None if bias_dtype is None else make("bias")
    args["out"] = make("out") if b["out"] else None
    ctx = Context(case, be, alloc, args, make)
    st = ctx.state

    def do_prepare() -> None:
        st["packed"] = prepare(
            args["weight"],
            out_dtype=args["out_dtype"],
            usage=args["usage"],
            weight_scale=args["weight_scale"],
            backend=be,
        )

    def packed() -> Any:
        how = ctx.flags.get("packed")
        if how == "other_kind":
            if scaled:
                return prepare(alloc.random((n, k), torch.bfloat16), backend=be)
            return prepare(int8((n, k)), weight_scale=scales((n,)), backend=be)
        if how == "other_k":
            w = int8((n, k + 1)) if scaled else alloc.random((n, k + 1), wdt)
            return prepare(w, weight_scale=scales((n,)) if scaled else None, backend=be)
        if how == "not_packed":
            return args["weight"]
        if how == "none":
            return None
        return st["packed"]

    def do_mm() -> None:
        if scaled:
            scaled_mm(args["x_q"], args["x_scale"], packed(), args["bias"], args["out"])
        else:
            mm(args["x"], packed(), args["bias"], args["out"])

    names = ("x_q", "x_scale") if scaled else ("x",)
    steps = [
        Step("prepare", do_prepare, list, ("weight", "weight_scale", "out_dtype", "usage")),
        Step(case["kind"], do_mm, lambda: ["out"], (*names, "packed", "bias", "out")),
    ]
    return _finish(ctx, steps)


# ---- per_token_group_quant -----------------------------------------------------------------

_QUANT_PARAMS = ("group_size", "dtype", "eps", "column_major_scales", "scale_ue8m0")


def _quant(case: dict[str, Any], be: Any, alloc: Alloc) -> Built:
    from ..ops.quant import per_token_group_quant

    b = case["base"]
    m, g, gs = b["m"], b["groups"], b["group_size"]
    dtype = dtype_of(b["dtype"])

    def make(slot: str) -> Any:
        if slot == "out":
            return alloc.empty((m, g * gs), dtype)
        if b["column_major_scales"]:
            return alloc.empty((g, m), torch.float32).t()
        return alloc.empty((m, g), torch.float32)

    args: dict[str, Any] = {
        "x": alloc.random((m, g * gs), dtype_of(b["in_dtype"])),
        "group_size": gs,
        "dtype": dtype,
        "eps": b["eps"],
        "column_major_scales": b["column_major_scales"],
        "scale_ue8m0": b["scale_ue8m0"],
        "out": make("out") if b["out"] else None,
        "out_scales": make("out_scales") if b["out_scales"] else None,
    }
    ctx = Context(case, be, alloc, args, make)
    ctx.oob = {"x": 10**6}

    def do_quant() -> None:
        per_token_group_quant(
            args["x"],
            **{p: args[p] for p in _QUANT_PARAMS},
            out=args["out"],
            out_scales=args["out_scales"],
            backend=be,
        )

    names = ("x", *_QUANT_PARAMS, "out", "out_scales")
    steps = [Step("per_token_group_quant", do_quant, lambda: ["out", "out_scales"], names)]
    return _finish(ctx, steps)


# ---- copy_state_blocks / zero_state_blocks -------------------------------------------------


def _state(case: dict[str, Any], be: Any, alloc: Alloc) -> Built:
    from ..ops.state import copy_state_blocks, zero_state_blocks

    b = case["base"]
    nb = b["num_blocks"]
    copy = case["kind"] == "copy_state_blocks"
    args: dict[str, Any] = {}
    for i, (shape, dt) in enumerate(zip(b["shapes"], b["dtypes"], strict=True)):
        args[f"states[{i}]"] = alloc.random((nb, *shape), dtype_of(dt))
    id_names = ("src_ids", "dst_ids") if copy else ("ids",)
    for name, key in zip(id_names, ("src", "dst") if copy else ("ids",), strict=True):
        t = alloc.empty((len(b[key]),), dtype_of(b["id_dtype"]))
        t.copy_(torch.tensor(b[key], dtype=torch.int64))
        args[name] = t

    def make(slot: str) -> Any:
        raise Inapplicable(f"{slot} is not optional")

    ctx = Context(case, be, alloc, args, make)
    ctx.oob = dict.fromkeys(id_names, nb)
    state_names = [k for k in args if k.startswith("states[")]

    def states() -> Any:
        how = ctx.flags.get("states")
        ts = [args[k] for k in state_names]
        if how == "blocks":
            return [*ts, args["states[extra]"]]
        return {
            "tuple": tuple(ts),
            "empty": [],
            "tensor": ts[0],
            "dup": [ts[0], ts[0]],
            "none": None,
            "one": ts[:1],
        }.get(how or "", ts)

    op = case["kind"]

    def do_state() -> None:
        if copy:
            copy_state_blocks(states(), args["src_ids"], args["dst_ids"], backend=be)
        else:
            zero_state_blocks(states(), args["ids"], backend=be)

    names = ("states", *state_names, *id_names)
    built = _finish(ctx, [Step(op, do_state, lambda: list(state_names), names)])
    if ctx.flags.get("states") == "blocks":  # a state tensor with one block more
        args["states[extra]"] = alloc.random((nb + 1, 2), torch.float32)
        state_names.append("states[extra]")
    return built


BUILDERS: dict[str, Callable[[dict[str, Any], Any, Alloc], Built]] = {
    "attention": _attention,
    "mm": _gemm,
    "scaled_mm": _gemm,
    "per_token_group_quant": _quant,
    "copy_state_blocks": _state,
    "zero_state_blocks": _state,
}
