"""The `modelyard` command.

    modelyard serve [--config FILE] [--host H] [--port P]

Without a config it serves SmolLM2 as `smollm2` (downloaded into the cache on first use). A
config with problems is reported in full and exits with status 2, before anything starts.
SIGINT/SIGTERM stop accepting connections, let running requests finish, then unload models.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from .config import Config, ConfigError, default_config, load_config

EXIT_CONFIG = 2

log = logging.getLogger("modelyard")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelyard", description="Self-hosted OpenAI-compatible gateway for GGUF models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve the OpenAI API",
                                description="Serve the OpenAI API for the models in a config.")
    serve.add_argument("--config", type=Path, metavar="FILE",
                       help="YAML, TOML or JSON config (default: serve SmolLM2 as 'smollm2')")
    serve.add_argument("--host", help="address to listen on (default: the config's, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default: the config's, 8080)")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"], help="default: info")
    return parser


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def _serve(config: Config, host: str, port: int) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig

    from .app import create_app

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    hconfig = HypercornConfig()
    hconfig.bind = [_bind(host, port)]
    hconfig.accesslog = None        # RequestLog writes one line per request instead
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.graceful_timeout = 10.0
    log.info("serving %s on http://%s", ", ".join(config.aliases()), _bind(host, port))
    await serve(create_app(config), hconfig, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    log.info("stopped")


def serve_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config) if args.config else default_config()
    except ConfigError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    asyncio.run(_serve(config, host, port))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve_command(args)
    return 1  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
