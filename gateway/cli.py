"""The `modelyard` command.

    modelyard serve [--config FILE] [--host H] [--port P] [--no-watch] [--watch-poll [MS]]
    modelyard scan DIR [-o FILE] [--format yaml|toml|json] [--update FILE]   (gateway/scan.py)

Without a config it serves SmolLM2 as `smollm2` (downloaded into the cache on first use). A
config with problems is reported in full and exits with status 2, before anything starts.
While serving, saving the config file reloads it (gateway/watch.py), and so does SIGHUP.
SIGINT/SIGTERM stop accepting connections, let running requests finish, then unload models.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from . import scan
from .config import Config, ConfigError, default_config, load_config
from .watch import WatchOptions

EXIT_CONFIG = 2

log = logging.getLogger("modelyard")


def _milliseconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of milliseconds, at least 1: "
                                         f"{text!r}")
    return value


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
    serve.add_argument("--watch", action=argparse.BooleanOptionalAction, default=True,
                       help="reload the config when its file (or a chat template file it names) "
                            "changes (default: on); SIGHUP and POST /admin/reload always reload")
    serve.add_argument("--watch-poll", nargs="?", type=_milliseconds, const=300, default=None,
                       metavar="MS", help="poll for changes every MS milliseconds (default 300) "
                       "instead of waiting for file system events, which container mounts and "
                       "network file systems may not deliver (also: WATCHFILES_FORCE_POLLING=1)")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"], help="default: info")
    serve.set_defaults(run=serve_command)
    _add_scan_command(commands)
    return parser


def _add_scan_command(commands: Any) -> None:
    parser = commands.add_parser("scan", help="write a config for the GGUF models in a folder",
                                 description="Write a config for the GGUF models under DIR.")
    scan.add_scan_arguments(parser)
    parser.set_defaults(run=scan.run_scan)


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def _serve(config: Config, host: str, port: int, config_path: Path | None,
                 watch: WatchOptions) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig

    from .app import create_app

    app = create_app(config, config_path=config_path, watch=watch)
    stop = asyncio.Event()

    def begin_stop() -> None:
        app.state.stopping = True  # /health answers 503 from now on
        stop.set()

    def reload_on_hangup() -> None:
        reloader = getattr(app.state, "reloader", None)
        if reloader is None:
            log.warning("SIGHUP before the server started; not reloading")
        else:
            reloader.request("SIGHUP")

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, begin_stop)
    loop.add_signal_handler(signal.SIGHUP, reload_on_hangup)

    hconfig = HypercornConfig()
    hconfig.bind = [_bind(host, port)]
    hconfig.accesslog = None        # RequestLog writes one line per request instead
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.graceful_timeout = 10.0
    log.info("serving %s on http://%s", ", ".join(config.aliases()), _bind(host, port))
    await serve(app, hconfig, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    log.info("stopped")


def serve_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config) if args.config else default_config()
    except ConfigError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    watch = WatchOptions(enabled=args.watch and args.config is not None,
                         force_polling=True if args.watch_poll is not None else None,
                         poll_delay_ms=args.watch_poll or 300)
    # absolute but not resolved: a symlinked config (a ConfigMap mount) is re-read through
    # its link, so a swapped link is followed on reload
    config_path = Path(args.config).absolute() if args.config else None
    asyncio.run(_serve(config, host, port, config_path, watch))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("watchfiles").setLevel(logging.WARNING)  # modelyard.watch says what changed
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
