"""Small Hugging Face checkpoints built locally: random weights from a fixed seed, a byte-level
tokenizer built with ``tokenizers``. No hub access exists on the machines this runs on, and the
bridge's tests and demo need real checkpoints that vLLM loads like any other.

    python -m plugin_api_vllm.tiny_model llama /tmp/tiny-llama --layers 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

# Model families, as (transformers config class, extra config fields).
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen3": ("Qwen3Config", {"head_dim": None}),
    # Mistral-style: every layer attends over a window of the last tokens
    "sliding": ("MistralConfig", {"sliding_window": 24}),
    # Llama with int8 W8A8 linear layers in the compressed-tensors format (per-channel weight
    # scales, dynamic per-token activation scales), as llm-compressor writes them
    "llama-w8a8": ("LlamaConfig", {}),
    # gpt-oss-style: attention sinks (a learned per-head logit in the softmax), alternating
    # sliding and global layers, a small mixture of experts (vLLM's kernels: no plugin-api family)
    "sinks": (
        "GptOssConfig",
        {
            "head_dim": None,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 24,
        },
    ),
    # Gemma-2-style: logits soft cap in attention, sliding and global layers alternating, and
    # the LM head tied to the embeddings
    "softcap": (
        "Gemma2Config",
        {
            "head_dim": None,
            "attn_logit_softcapping": 20.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 24,
            "query_pre_attn_scalar": 32,
            "tie_word_embeddings": True,
        },
    ),
    # Gemma-4 text stack (Gemma4ForCausalLM): the second half of the layers computes no K/V and
    # reads the cache of the last earlier layer of its type (vLLM's kv_sharing_target_layer_name;
    # their attention gets key=value=None); with 4 layers, 2 (sliding) reads 0 and 3 (global)
    # reads 1. QK norms, a parameter-free V norm, scale 1, partial ("proportional") RoPE on the
    # global layers; one head size on every layer, no per-layer input embeddings, no experts.
    # LM head untied: tied, these random weights only repeat the last token
    "kv-sharing": (
        "Gemma4TextConfig",
        {
            "head_dim": None,
            "global_head_dim": None,
            "sliding_window": 24,
            "hidden_size_per_layer_input": 0,
        },
    ),
}


@dataclass(frozen=True)
class Shape:
    layers: int = 2
    hidden: int = 256
    intermediate: int = 512
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 1024
    max_positions: int = 4096
    extra: dict[str, Any] = field(default_factory=dict)


# The end-to-end benchmark's model: 0.49B parameters, large enough not to be pure overhead.
BENCH_SHAPE = Shape(
    layers=8, hidden=2048, intermediate=5632, heads=32, kv_heads=8, vocab=32000, max_positions=4096
)

# A kind's shape where the default one does not fit it
DEFAULT_SHAPES = {"kv-sharing": Shape(layers=4)}

SPECIALS = ["<s>", "</s>"]


def _kv_sharing_layers(layers: int) -> dict[str, Any]:
    """Sliding and global layers alternating; the second half reads the first half's cache
    (each layer the last earlier one of its type: with 4 layers, 2 -> 0 and 3 -> 1)."""
    if layers < 4 or layers % 2:
        raise ValueError(f"kv-sharing needs an even number of layers >= 4, not {layers}")
    return {
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "num_kv_shared_layers": layers // 2,
    }


def byte_level_tokenizer(vocab: int) -> Any:
    """A byte-level tokenizer (one token per byte, no merges) padded with added tokens up to
    ``vocab``, so every id the model can produce decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    table = {ch: i for i, ch in enumerate(SPECIALS + sorted(alphabet))}
    if vocab < len(table):
        raise ValueError(f"vocab={vocab} is below the {len(table)} byte-level tokens")
    tok = Tokenizer(models.BPE(vocab=table, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens([f"<|w{i}|>" for i in range(vocab - len(table))])
    return tok


def build(kind: str, path: str | Path, shape: Shape | None = None, *, seed: int = 0) -> Path:
    """Write a ``kind`` checkpoint of ``shape`` (default: the kind's) to ``path`` (config,
    safetensors, tokenizer)."""
    import transformers

    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; known: {', '.join(KINDS)}")
    cls_name, extra = KINDS[kind]
    if shape is None:
        shape = DEFAULT_SHAPES.get(kind, Shape())
    fields = {
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.max_positions,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "dtype": "float32",
        **{k: v for k, v in extra.items() if v is not None},
        **shape.extra,
    }
    for key in ("head_dim", "global_head_dim"):  # None in KINDS: hidden / heads
        if key in extra:
            fields[key] = shape.hidden // shape.heads
    if kind == "kv-sharing":
        fields |= _kv_sharing_layers(shape.layers)
    config = getattr(transformers, cls_name)(**fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # wider than the default init, so greedy tokens differ from step to step
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.08)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=byte_level_tokenizer(shape.vocab), bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(out)
    if kind == "llama-w8a8":
        _quantize_w8a8(out)
    (out / "plugin_api_tiny_model.json").write_text(
        json.dumps({"kind": kind, "seed": seed, "shape": shape.__dict__}, indent=1)
    )
    return out


W8A8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head"],
}


def _quantize_w8a8(out: Path) -> None:
    """Rewrite a saved checkpoint's linear weights as int8 with per-channel scales."""
    from safetensors.torch import load_file, save_file

    weights = load_file(out / "model.safetensors")
    for name in [n for n in weights if n.endswith("_proj.weight")]:
        w = weights[name]
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
        weights[name] = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
        weights[name.removesuffix("weight") + "weight_scale"] = scale.to(torch.float32)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = W8A8_CONFIG
    (out / "config.json").write_text(json.dumps(config, indent=2))


def lora_adapter(model: str | Path, path: str | Path, *, rank: int = 8, seed: int = 1) -> Path:
    """Write a PEFT LoRA adapter for the checkpoint at ``model`` to ``path``: random seeded A and B
    of ``rank`` on every ``*_proj`` linear layer, large enough to change greedy tokens."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    adapter: dict[str, torch.Tensor] = {}
    targets = set()
    with safe_open(str(Path(model) / "model.safetensors"), "pt") as weights:
        for name in sorted(weights.keys()):
            if not name.endswith("_proj.weight"):
                continue
            n, k = weights.get_slice(name).get_shape()
            module = "base_model.model." + name.removesuffix(".weight")
            adapter[module + ".lora_A.weight"] = torch.randn(rank, k, generator=gen) * 0.05
            adapter[module + ".lora_B.weight"] = torch.randn(n, rank, generator=gen) * 0.05
            targets.add(name.split(".")[-2])
    if not adapter:
        raise ValueError(f"model={str(model)!r} has no *_proj linear weights to adapt")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter, out / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return out


CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "plugin-api" / "models"


def cached(name: str, kind: str, shape: Shape) -> Path:
    """A checkpoint built once into ``CACHE/name`` (the demo's and the benchmark's models)."""
    path = CACHE / name
    if not (path / "config.json").exists():
        print(f"... building the {kind} model {name} in {path}", file=sys.stderr, flush=True)
        build(kind, path, shape, seed=0)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("path")
    ap.add_argument("--layers", type=int, help=f"default {Shape.layers} (kv-sharing: 4)")
    ap.add_argument("--bench-shape", action="store_true", help="the benchmark's 0.49B shape")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    shape = DEFAULT_SHAPES.get(args.kind, Shape())
    if args.bench_shape:
        shape = BENCH_SHAPE
    if args.layers is not None:
        shape = replace(shape, layers=args.layers)
    print(build(args.kind, args.path, shape, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
