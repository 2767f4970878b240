"""``python -m ci.images key|lint|lookup|promote|attest``; every verb has ``--json``.

Exit codes: 0 success (lookup: a hit), 10 lookup miss (build and push to ``push_tag``),
1 bad input (Dockerfile, build inputs, lint errors), 2 usage, 3 registry error (never rebuild or
promote on it), 4 a content tag with wrong labels, 5 promotion refused, 6 stable alias conflict.
Environment: ``CI_IMAGES_REGISTRY_AUTH=user:password`` for the registry and
``CI_IMAGES_ATTESTATION_KEYS=builder=hexkey,...`` for attestations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import attest, key, lint, lookup, promote
from .errors import ImagesError
from .names import STABLE_TAG, Namespace, build_labels, tag_for
from .registry import Registry

MISS_EXIT = 10
AUTH_ENV = "CI_IMAGES_REGISTRY_AUTH"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.verb == "promote" and args.target_namespace == "stable" and not args.expect:
        parser.error("promote stable needs --expect <digest>|none (the digest the alias reads now)")
    try:
        return int(args.func(args))
    except ImagesError as e:
        error = {"type": type(e).__name__, "message": str(e), "exit_code": e.exit_code}
        trace = [s.to_dict() for s in e.trace if hasattr(s, "to_dict")]
        if args.json:
            print(json.dumps({"error": error, "trace": trace}, indent=2))
        else:
            print(f"error ({type(e).__name__}): {e}", file=sys.stderr)
        return e.exit_code
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# --- verbs -----------------------------------------------------------------------------------


def cmd_key(args: argparse.Namespace) -> int:
    k = _key(args)
    data = {
        "key": k.key,
        "tags": {
            "trusted": tag_for(Namespace.TRUSTED, k.key),
            "preview": tag_for(Namespace.PREVIEW, k.key),
            "stable": STABLE_TAG,
        },
        "labels": build_labels(k.key),
        "record": k.record,
    }
    _emit(args, data, _key_text)
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    files = []
    errors = 0
    for path in args.dockerfiles:
        findings = lint.lint(Path(path))
        errors += sum(f.severity == "error" for f in findings)
        files.append({"path": path, "findings": [f.to_dict() for f in findings]})
    data = {"files": files, "errors": errors}
    _emit(args, data, _lint_text)
    return 1 if errors else 0


def cmd_lookup(args: argparse.Namespace) -> int:
    k = _key(args)
    out = lookup.find_image(
        _registry(args),
        args.repo,
        k.key,
        lookup.Kind(args.kind),
        _policy(args),
        platform=args.platform,
        stable_tag=args.stable_tag,
    )
    _emit(args, out.to_dict(), _lookup_text)
    return 0 if out.hit else MISS_EXIT


def cmd_promote(args: argparse.Namespace) -> int:
    k = _key(args)
    client = _registry(args)
    if args.target_namespace == "trusted":
        write = promote.promote_preview(
            client, args.repo, k.key, _policy(args), platform=args.platform
        )
    else:
        expected = None if args.expect == "none" else args.expect
        write = promote.move_stable(
            client,
            args.repo,
            k.key,
            expected,
            window_s=args.window,
            stable_tag=args.stable_tag,
            platform=args.platform,
        )
    _emit(args, {"key": k.key, "write": write.to_dict()}, _write_text)
    return 0


def cmd_attest(args: argparse.Namespace) -> int:
    k = _key(args)
    keyring = attest.Keyring.parse(os.environ.get(attest.KEYS_ENV))
    write = promote.attest_preview(
        _registry(args), args.repo, k.key, args.builder, keyring, args.platform
    )
    _emit(args, {"key": k.key, "write": write.to_dict()}, _write_text)
    return 0


# --- helpers ---------------------------------------------------------------------------------


def _key(args: argparse.Namespace) -> key.ImageKey:
    build_args = {}
    for item in args.build_arg:
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--build-arg {item!r}: expected NAME=VALUE")
        build_args[name] = value
    return key.compute(
        Path(args.dockerfile),
        Path(args.context),
        build_args,
        platform=args.platform,
        target=args.target,
    )


def registry_credentials() -> tuple[str, str] | None:
    """(user, password) from ``CI_IMAGES_REGISTRY_AUTH=user:password``; None when unset."""
    auth = os.environ.get(AUTH_ENV)
    if not auth:
        return None
    user, colon, password = auth.partition(":")
    if not colon:
        raise ValueError(f"{AUTH_ENV} must be user:password")
    return user, password


def _registry(args: argparse.Namespace) -> Registry:
    return Registry(
        args.registry,
        timeout=args.timeout,
        retries=args.retries,
        credentials=registry_credentials(),
    )


def _policy(args: argparse.Namespace) -> promote.Policy:
    return promote.Policy(
        promote.Mode(args.policy),
        frozenset(args.allow_builder),
        attest.Keyring.parse(os.environ.get(attest.KEYS_ENV)),
    )


def _emit(args: argparse.Namespace, data: dict[str, Any], text: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2) if args.json else text(data))


def _key_text(d: dict[str, Any]) -> str:
    r = d["record"]
    lines = [
        f"key      {d['key']}",
        f"tags     trusted {d['tags']['trusted']}",
        f"         preview {d['tags']['preview']}",
        "labels   " + " ".join(f"{k}={v}" for k, v in d["labels"].items()),
        f"record   schema {r['schema']}, platform {r['platform']}, target {r['target']}",
        "parents  " + ", ".join(r["parents"]),
    ]
    lines += [f"images   {i}" for i in r["images"]]
    lines += [f"remote   {x['url']} {x['checksum']}" for x in r["remote"]]
    lines += [f"arg      {a['scope']}: {a['name']}={a['value']}" for a in r["args"]]
    lines.append(f"inputs   {len(r['inputs'])} (Dockerfile {r['dockerfile']})")
    for i in r["inputs"]:
        what = i.get("sha256", "")[:16] if i["type"] == "file" else i.get("target", "")
        lines.append(f"  {i['type']:<7} {i.get('mode', '----')} {what:<16} {i['path']}")
    return "\n".join(lines)


def _lint_text(d: dict[str, Any]) -> str:
    lines = []
    for f in d["files"]:
        lines.append(f"{f['path']}: {len(f['findings'])} finding(s)")
        lines += [
            f"  line {x['line']}: {x['severity']} [{x['rule']}] {x['message']}"
            for x in f["findings"]
        ]
    return "\n".join(lines)


def _lookup_text(d: dict[str, Any]) -> str:
    lines = [
        f"{s['namespace']:<8} {s['tag']}: {s['result']} {s['reason']}".rstrip() for s in d["trace"]
    ]
    lines += [f"wrote    {w['tag']} -> {w['digest']} (from {w['source']})" for w in d["writes"]]
    if d["outcome"] == "hit":
        lines.append(f"hit      {d['ref']} (from {d['source']})")
    else:
        labels = " ".join(f"--label {k}={v}" for k, v in d["labels"].items())
        lines.append(f"miss     build and push {d['repo']}:{d['push_tag']} with {labels}")
    return "\n".join(lines)


def _write_text(d: dict[str, Any]) -> str:
    w = d["write"]
    return f"{w['tag']} -> {w['digest']} (was {w['previous'] or 'absent'}; from {w['source']})"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ci.images", description=__doc__.split("\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True)

    def verb(
        name: str, func: Callable[[argparse.Namespace], int], summary: str
    ) -> argparse.ArgumentParser:
        sp = verbs.add_parser(name, help=summary, description=summary)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=func)
        return sp

    key_p = verb("key", cmd_key, "print the image key of a Dockerfile and its full input record")
    _key_options(key_p)
    lint_p = verb("lint", cmd_lint, "report unpinned inputs in Dockerfiles (exit 1 on errors)")
    lint_p.add_argument("dockerfiles", nargs="+", metavar="DOCKERFILE")
    look = verb("lookup", cmd_lookup, "find a reusable image (exit 0 hit, 10 miss)")
    _key_options(look)
    _registry_options(look)
    look.add_argument("--kind", choices=[k.value for k in lookup.Kind], required=True)
    _policy_options(look)
    prom = verb("promote", cmd_promote, "preview -> trusted (policy), or move the stable alias")
    prom.add_argument("target_namespace", choices=["trusted", "stable"])
    _key_options(prom)
    _registry_options(prom)
    _policy_options(prom)
    prom.add_argument("--expect", help="stable: the digest it must read now, or 'none'")
    prom.add_argument("--window", type=float, default=10.0, help="stable: seconds (default 10)")
    att = verb("attest", cmd_attest, "record a builder attestation on the preview image")
    _key_options(att)
    _registry_options(att)
    att.add_argument("--builder", required=True, help="this builder's id (its key: env)")
    return p


def _key_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dockerfile", metavar="DOCKERFILE")
    p.add_argument("--context", default=".", help="build context (default: .)")
    p.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--platform", default="linux/amd64")
    p.add_argument("--target", default=None, help="build target stage")


def _registry_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", required=True, help="e.g. https://ghcr.io")
    p.add_argument("--repo", required=True, help="repository, e.g. plugin-api/ci-rocm")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    p.add_argument("--retries", type=int, default=3, help="retries after transient errors")
    p.add_argument("--stable-tag", default=STABLE_TAG)


def _policy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=[m.value for m in promote.Mode], default="never")
    p.add_argument("--allow-builder", action="append", default=[], metavar="ID")
