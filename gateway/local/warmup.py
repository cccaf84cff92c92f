"""`modelyard warmup [MODEL.gguf ...] [--config FILE | --models-dir DIR]`: compile the engine's
kernels ahead of time, so no first request (nor a container's first start) waits for them.

Each model is loaded exactly as the server would load it (its entry's n_ctx, threads, slots,
attention path, projector), which compiles what a cold cache lacks into the kernel cache
(MODELYARD_CACHE), and closed again. With nothing named, the default model (fetched if need
be). Kernels depend on the CPU, so warm up on the machine (or image) that serves.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import engine
from engine.kernels import jit
from gateway.config import Config, ConfigError, ModelEntry, load_config

log = logging.getLogger("modelyard.warmup")


def add_warmup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", type=Path, metavar="MODEL.gguf",
                        help="model files (default: the default model)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="every model file entry of this config, with its settings")
    parser.add_argument("--models-dir", type=Path, metavar="DIR",
                        help="every model under DIR, as serve --models-dir would serve it")


def _config(args: argparse.Namespace) -> Config:
    from gateway.fleet import zeroconf

    if args.config:
        return load_config(args.config)
    if args.models_dir:
        return zeroconf.config_for_dir(args.models_dir)
    if args.models:
        return zeroconf.config_for_files(args.models)
    from engine.default_model import default_model_path

    return zeroconf.config_for_files([default_model_path()])


def warm(entry: ModelEntry) -> int:
    """Load and close `entry`'s model as the server would; the number of kernels compiled."""
    started = time.monotonic()
    with jit.reporting(entry.name) as report:
        model = engine.load(entry.model, n_ctx=entry.n_ctx, n_threads=entry.n_threads,
                            n_slots=entry.n_parallel, flash_attn=entry.flash_attn,
                            images=entry.mmproj is not None, name=entry.name,
                            type_k=entry.kv_cache_types[0], type_v=entry.kv_cache_types[1])
        model.close()
        if entry.mmproj is not None:
            from engine.vision import VisionModel

            VisionModel(entry.mmproj, n_threads=entry.n_threads).close()
    what = (f"{report.count} kernels compiled" if report.count else "every kernel was cached")
    log.info("%s is warm: %s (%.1fs)", entry.name, what, time.monotonic() - started)
    return report.count


def run_warmup(args: argparse.Namespace) -> int:
    if sum(bool(x) for x in (args.models, args.models_dir, args.config)) > 1:
        print("modelyard: give model files, --models-dir or --config, not several",
              file=sys.stderr)
        return 2
    try:
        config = _config(args)
    except (ConfigError, OSError) as e:
        print(f"modelyard: {e}", file=sys.stderr)
        return 2
    for entry in config.models:
        if isinstance(entry, ModelEntry):
            try:
                warm(entry)
            except engine.ModelLoadError as e:
                print(f"modelyard: {entry.name}: {e}", file=sys.stderr)
                return 1
    return 0
