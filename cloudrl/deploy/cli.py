"""``cloudrl deploy``: render and check the Kubernetes manifests without a cluster.

* ``cloudrl deploy render DIR``: the resources a kustomization renders to (YAML);
* ``cloudrl deploy check DIR [DIR ...]``: render and validate every resource; one line per
  problem, exit code 2 when there is one;
* ``cloudrl deploy render-serve-config``: the RayService's ``serveConfigV2`` patch from
  ``serve_apps/config.yaml`` (``--out FILE`` writes it; ``--check FILE`` exits 2 when
  FILE is stale).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cloudrl.config_loader import ConfigError


def _render(directory: str) -> list[dict[str, Any]]:
    from cloudrl.deploy.kustomize import KustomizeError, render

    try:
        return render(directory)
    except KustomizeError as e:
        raise ConfigError(str(e)) from None


def _cmd_render(args: argparse.Namespace) -> int:
    from cloudrl.deploy.kustomize import to_yaml

    print(to_yaml(_render(args.dir)), end="")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from cloudrl.deploy.validate import SCHEMA_DIR, check

    try:
        import jsonschema  # noqa: F401
        import kubernetes_validate  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"cloudrl deploy check needs {e.name}: pip install -e '.[dev]'") \
            from None
    schema_dir = Path(args.schemas) if args.schemas else SCHEMA_DIR
    bad = 0
    for directory in args.dir:
        resources = _render(directory)
        found = check(resources, schema_dir)
        for line in found:
            print(f"{directory}: {line}")
        bad += len(found)
        if not found:
            print(f"{directory}: {len(resources)} resources valid")
    return 2 if bad else 0


def _cmd_render_serve_config(args: argparse.Namespace) -> int:
    from cloudrl.deploy.serve_config import render_patch

    text = render_patch(args.config)
    if args.check:
        path = Path(args.check)
        if not path.is_file() or path.read_text() != text:
            raise ConfigError(f"{path} is stale: run 'cloudrl deploy render-serve-config "
                              f"--out {path}'")
        print(f"{path} is up to date")
    elif args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def register(sub: Any) -> None:
    dp = sub.add_parser("deploy", help="Kubernetes (KubeRay) manifests: render and check "
                                       "them without a cluster")
    dp_sub = dp.add_subparsers(dest="deploy_command", required=True)
    rd = dp_sub.add_parser("render", help="the resources a kustomization renders to")
    rd.add_argument("dir", help="a kustomization directory, e.g. "
                                "deploy/kubernetes/overlays/cpu")
    rd.set_defaults(func=_cmd_render)
    ck = dp_sub.add_parser("check", help="render and validate against the Kubernetes and "
                                         "KubeRay schemas (exit 2 on a problem)")
    ck.add_argument("dir", nargs="+", help="kustomization directories")
    ck.add_argument("--schemas", help="directory of the KubeRay CRD JSON schemas "
                                      "(default deploy/kubernetes/schemas)")
    ck.set_defaults(func=_cmd_check)
    sc = dp_sub.add_parser("render-serve-config", help="the RayService's serveConfigV2 "
                           "patch, generated from the decision service's Serve config")
    sc.add_argument("--config", help="Serve config YAML (default serve_apps/config.yaml)")
    out = sc.add_mutually_exclusive_group()
    out.add_argument("--out", help="write the patch to this file (default: print it)")
    out.add_argument("--check", metavar="FILE", help="exit 2 when FILE is not what "
                                                     "would be written")
    sc.set_defaults(func=_cmd_render_serve_config)
