"""`terrascale` command line (contract §2). Exit 0 success, 1 failure, 2 usage.

argparse (standard library) gives exit status 2 and a usage line on bad
arguments, which is what the contract asks; every failure below it is one
line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from catalog.errors import CatalogError
from node import config as config_mod
from node.errors import NodeError
from terrafs.errors import TerrafsError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="terrascale", description="Terrascale storage engine")
    p.add_argument("--endpoint", default=os.environ.get("TERRASCALE_ENDPOINT", "http://127.0.0.1:7400"))
    p.add_argument("--token", default=os.environ.get("TERRASCALE_TOKEN"))
    sub = p.add_subparsers(dest="cmd", required=True)
    node = sub.add_parser("node", help="run a node daemon").add_subparsers(dest="node_cmd", required=True)
    run = node.add_parser("run", help="run a node in the foreground")
    run.add_argument("--config", help="TOML config file (contract §4)")
    run.add_argument("--data-dir", default="./data", help="embedded defaults under this directory")
    run.add_argument("--listen", help="HOST:PORT (overrides the config)")
    fsck = sub.add_parser("fsck", help="offline: verify every checksum and invariant of a node's data")
    fsck.add_argument("data_dir", nargs="?", help="a data directory with the embedded layout")
    fsck.add_argument("--config", help="check the stores this config names")
    return p


def _setup_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")


def _node_run(args) -> int:
    from dataclasses import replace

    from node.daemon import run

    cfg = config_mod.load(args.config) if args.config else config_mod.defaults(args.data_dir)
    if args.listen:
        cfg = replace(cfg, listen=config_mod.parse_listen("--listen", args.listen))
    asyncio.run(run(cfg))
    return 0


def _fsck(args, parser) -> int:
    from node.fsck import fsck

    if bool(args.data_dir) == bool(args.config):
        parser.error("fsck takes DATA_DIR or --config FILE")
    if args.data_dir and not os.path.isdir(args.data_dir):
        raise config_mod.ConfigError(f"DATA_DIR: {args.data_dir} is not a directory")
    cfg = config_mod.load(args.config) if args.config else config_mod.defaults(args.data_dir)
    problems = asyncio.run(fsck(cfg))
    for p in problems:
        print(p.line())
    damaged = [p for p in problems if p.damage]
    print(f"fsck: {len(damaged)} problem(s), {len(problems) - len(damaged)} notice(s)", file=sys.stderr)
    return 1 if damaged else 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging()
    try:
        if args.cmd == "node":
            return _node_run(args)
        if args.cmd == "fsck":
            return _fsck(args, parser)
    except (NodeError, TerrafsError, CatalogError) as e:
        print(f"terrascale: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
