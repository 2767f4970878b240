"""``plugin-api warm-up``: build or load the selected backend's kernels for a model's layers.

The layers are the doctor's example models (``model_specs.MODELS``) or those read from a
Hugging Face ``config.json`` (``--config``): attention per kind of layer, the linear layers
(qkv, o, gate_up, down, lm_head), and for int8 W8A8 checkpoints the activation quantization.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, cast

import torch

from ..contract import OpFamily
from ..ops.attention import AttentionSpec
from ..ops.gemm import GemmSpec
from ..ops.quant import QuantSpec
from .model_specs import MODELS, Layer

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="PATH",
        type=Path,
        help="a Hugging Face config.json (or its folder) to derive the layers from "
        "(default: the doctor's example models)",
    )
    p.add_argument(
        "--block-size",
        metavar="N",
        type=int,
        help="KV cache block size of the attention layers read from --config (default 16)",
    )
    p.add_argument(
        "--gemm-rows",
        metavar="M,...",
        default="1",
        help="the M of each warm-up GEMM call, comma-separated (default 1); oneDNN builds a "
        "primitive per M, so pass the batch sizes the engine runs",
    )
    p.add_argument("--backend", metavar="ID", help="warm this backend instead of the selected one")


def cmd_warm_up(args: argparse.Namespace) -> int:
    """0 when every item was warmed, 1 when one failed (its error is in the report)."""
    from .._warm_up import Spec, warm_up
    from ..backend import backend_for, process_backend

    rows = parse_rows(args.gemm_rows)
    if args.config is not None:
        block_size = 16 if args.block_size is None else args.block_size
        layers = layers_from_config(args.config, block_size=block_size)
        source = str(args.config)
    elif args.block_size is not None:
        raise ValueError("--block-size applies to the layers of --config; give --config too")
    else:
        layers = default_layers()
        source = "the doctor's example models"
    backend = backend_for(args.backend) if args.backend else process_backend()
    specs = {layer.name: cast("Spec", layer.spec) for layer in layers}
    report = warm_up(specs, backend=backend, gemm_rows=rows)
    data: dict[str, Any] = {"source": source, "gemm_rows": list(rows)}
    data |= report.to_dict(tracebacks=args.verbose)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(report_text(data))
    return 0 if report.ok else 1


def default_layers() -> tuple[Layer, ...]:
    """The doctor's example models' layers, named ``"<model>: <layer>"``."""
    return tuple(
        Layer(f"{m.name}: {layer.name}", layer.family, layer.spec)
        for m in MODELS
        for layer in m.layers
    )


def report_text(data: dict[str, Any]) -> str:
    lines = [
        f"warm-up on {data['backend']} ({data['device_type']}) for {data['source']}: "
        f"{len(data['items'])} items in {data['seconds']:.1f} s"
    ]
    for item in data["items"]:
        impl = item["implementation"]
        who = "-" if impl is None else f"{impl['backend']}:{impl['impl']} [{impl['path']}]"
        mark = "+" if item["ok"] else "!"
        fb = " (fallback)" if item["fallback"] else ""
        lines.append(
            f"  {mark} {item['family']:<9} {item['spec']:<44} {who}{fb} {item['seconds']:.1f} s"
        )
        if "error" in item:
            error = item["error"]
            lines.append(f"      {error['type']}: {error['message']}")
            lines.extend("      | " + ln for ln in error.get("traceback", "").rstrip().splitlines())
    failed = sum(not item["ok"] for item in data["items"])
    lines.append("all warmed" if not failed else f"{failed} item(s) failed")
    return "\n".join(lines)


def parse_rows(text: str) -> tuple[int, ...]:
    rows = []
    for part in text.split(","):
        try:
            m = int(part)
        except ValueError:
            m = 0
        if m < 1:
            raise ValueError(f"--gemm-rows {text!r}: expected positive ints separated by commas")
        rows.append(m)
    return tuple(rows)


def layers_from_config(path: Path, *, block_size: int = 16) -> tuple[Layer, ...]:
    """The layers of the model a Hugging Face ``config.json`` describes (``path`` may be the
    checkpoint folder). A multimodal config's ``text_config`` is read. Errors name the file and
    the field."""
    if path.is_dir():
        path = path / "config.json"
    where = f"--config {path}"
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"--block-size {block_size}: must be a positive int")
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror or e})") from e
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from e
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    cfg = raw
    if isinstance(raw.get("text_config"), dict):
        cfg = {**raw, **raw["text_config"]}
    return _Reader(where, cfg).layers(block_size)


class _Reader:
    """Reads fields of one config, each error naming the file and the field."""

    def __init__(self, where: str, cfg: dict[str, Any]) -> None:
        self.where, self.cfg = where, cfg

    def fail(self, message: str) -> ValueError:
        return ValueError(f"{self.where}: {message}")

    def count(self, key: str, default: int | None = None) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is not None:
                return default
            raise self.fail(f"{key!r} is missing (needed to derive the layers' shapes)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{key}={value!r} must be a positive int")
        return value

    def number(self, key: str) -> float | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(f"{key}={value!r} must be a positive number or null")
        return float(value)

    def dtype(self) -> torch.dtype:
        name = self.cfg.get("torch_dtype", self.cfg.get("dtype")) or "bfloat16"
        if name not in DTYPES:
            raise self.fail(f"torch_dtype={name!r} is not one of {sorted(DTYPES)}")
        return DTYPES[name]

    def w8a8(self) -> bool:
        """Whether the linear layers are int8 W8A8 (compressed-tensors, per-channel weights,
        dynamic per-token activations); any other quantization is refused, not ignored."""
        q = self.cfg.get("quantization_config")
        if q is None:
            return False
        method = q.get("quant_method") if isinstance(q, dict) else None
        groups = q.get("config_groups") if isinstance(q, dict) else None
        if method != "compressed-tensors" or not isinstance(groups, dict) or not groups:
            raise self.fail(
                f"quantization_config (quant_method={method!r}) is not read here: only int8 "
                "W8A8 in the compressed-tensors format is"
            )
        for name, g in groups.items():
            w = g.get("weights") if isinstance(g, dict) else None
            a = g.get("input_activations") if isinstance(g, dict) else None
            int8 = {"num_bits": 8, "type": "int"}
            if not (
                isinstance(w, dict)
                and isinstance(a, dict)
                and all(w.get(k) == v and a.get(k) == v for k, v in int8.items())
                and w.get("strategy") == "channel"
                and a.get("strategy") == "token"
                and a.get("dynamic") is True
            ):
                raise self.fail(
                    f"quantization_config.config_groups.{name} is not int8 W8A8 (per-channel "
                    "int8 weights, dynamic per-token int8 activations)"
                )
        ignore = q.get("ignore", [])
        if ignore not in ([], ["lm_head"]):
            raise self.fail(f"quantization_config.ignore={ignore!r}: only 'lm_head' is read here")
        return True

    def windows(self) -> list[tuple[int | None, bool]]:
        """(sliding window or None, KV-shared) of each kind of attention layer, in order."""
        window = self.cfg.get("sliding_window")
        if window is not None:
            window = self.count("sliding_window")
        if self.cfg.get("use_sliding_window") is False:
            window = None
        types = self.cfg.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or not types:
                raise self.fail(f"layer_types={types!r} must be a non-empty list")
            bad = sorted({t for t in types if t not in LAYER_TYPES}, key=str)
            if bad:
                raise self.fail(
                    f"layer_types holds {bad}; attention layers are {list(LAYER_TYPES)}"
                )
            sliding = [LAYER_TYPES[t] and window is not None for t in types]
        else:
            sliding = [window is not None] * self.count("num_hidden_layers", 1)
        shared = self.cfg.get("num_kv_shared_layers") or 0
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise self.fail(f"num_kv_shared_layers={shared!r} must be an int >= 0")
        first_shared = len(sliding) - shared
        kinds = [(window if s else None, i >= first_shared) for i, s in enumerate(sliding)]
        return list(dict.fromkeys(kinds))

    def layers(self, block_size: int) -> tuple[Layer, ...]:
        hidden = self.count("hidden_size")
        heads = self.count("num_attention_heads")
        kv_heads = self.count("num_key_value_heads", heads)
        head = self.count("head_dim", hidden // heads)
        inter = self.count("intermediate_size")
        vocab = self.count("vocab_size")
        dtype = self.dtype()
        if heads % kv_heads:
            raise self.fail(f"num_attention_heads={heads} is not a multiple of {kv_heads=}")
        pre_attn = self.number("query_pre_attn_scalar")
        common: dict[str, Any] = {
            "dtype": dtype,
            "block_size": block_size,
            "logits_soft_cap": self.number("attn_logit_softcapping"),
            "has_sinks": self.cfg.get("model_type") == "gpt_oss",  # learned sinks in every layer
            "scale": None if pre_attn is None else pre_attn**-0.5,
        }
        out = []
        for window, shared in self.windows():
            name = ("sliding " if window else "") + ("kv-shared " if shared else "") + "attention"
            spec = AttentionSpec(
                heads, kv_heads, head, sliding_window=window, kv_sharing=shared, **common
            )
            out.append(Layer(name, OpFamily.ATTENTION, spec))
        w8a8 = self.w8a8()
        weight = torch.int8 if w8a8 else dtype
        linears = (
            ("qkv_proj", (heads + 2 * kv_heads) * head, hidden),
            ("o_proj", hidden, heads * head),
            ("gate_up_proj", 2 * inter, hidden),
            ("down_proj", hidden, inter),
        )
        for name, n, k in linears:
            out.append(Layer(name, OpFamily.GEMM, GemmSpec(n, k, weight, dtype)))
        if w8a8:  # one group per row: the per-token scale of each linear layer's input
            for k in dict.fromkeys(k for _, _, k in linears):
                spec_q = QuantSpec(k, k, dtype, torch.int8)
                out.append(Layer(f"activation quant K={k}", OpFamily.QUANT, spec_q))
        lm_head = GemmSpec(vocab, hidden, dtype, torch.float32, "lm_head")
        out.append(Layer("lm_head", OpFamily.GEMM, lm_head))
        return tuple(out)
