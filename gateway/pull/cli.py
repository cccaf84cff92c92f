"""`modelyard pull owner/repo[:QUANT] | URL [--mmproj] [--dir DIR]`: a GGUF from the hub into
the models folder (default: $MODELYARD_CACHE/models, ~/.cache/modelyard/models).

Files download as hidden `.NAME.part` beside their final name (scan and a watching
`serve --models-dir` pass hidden files over), are checked against the hub's sha256, and are
renamed into place only when every file of the model is there: the projector first, then a split
model's parts from the last to the first, so a watching server sees one whole model appear.
An interrupted pull keeps its .part files; the same command resumes them.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gateway.pull import hub, spec

EXIT_OK, EXIT_FAILED = 0, 1


def models_dir() -> Path:
    from engine.default_model import cache_root

    return cache_root() / "models"


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="owner/repo[:QUANT]|URL",
                        help="a Hugging Face repository (the Q4_K_M file unless QUANT says "
                             "otherwise), or the URL of one GGUF file")
    parser.add_argument("--mmproj", action="store_true",
                        help="also fetch the repository's vision projector (mmproj*.gguf)")
    parser.add_argument("--dir", type=Path, default=None, metavar="DIR",
                        help="where to put it (default: ~/.cache/modelyard/models, or "
                             "$MODELYARD_CACHE/models)")
    parser.add_argument("--revision", default=None,
                        help="a branch, tag or commit of the repository (default: main)")


def _say(text: str) -> None:
    print(f"modelyard: {text}", file=sys.stderr, flush=True)


def _progress(name: str, total: int, done: int) -> Callable[[int], None]:
    from tqdm import tqdm

    bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, desc=name, file=sys.stderr)
    if done:
        _say(f"resuming {name} from {done} bytes")

    def advance(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()
    return advance


def pull(text: str, folder: Path, *, mmproj: bool = False, revision: str | None = None,
         progress: Callable[[str, int, int], Callable[[int], None]] = _progress) -> list[Path]:
    """Download what `text` names into `folder`; the final paths, model first."""
    wanted = spec.parse(text)
    if revision:
        wanted = spec.Wanted(wanted.repo, revision, wanted.quant, wanted.path)
    folder.mkdir(parents=True, exist_ok=True)
    with hub.client() as http:
        files = {f.path: f for f in hub.list_files(http, wanted.repo, wanted.revision)}
        chosen = spec.choose(wanted, list(files), mmproj)
        finals = [folder / Path(path).name for path in chosen]
        for path, final in zip(chosen, finals):
            remote = files[path]
            if final.is_file() and remote.size is not None and final.stat().st_size == remote.size:
                _say(f"{final.name} is there already")
                continue
            _say(f"downloading {wanted.repo}/{path}"
                 + (f" ({remote.size / 1e6:.1f} MB)" if remote.size else ""))
            hub.download(http, wanted.repo, wanted.revision, remote,
                         final.with_name(f".{final.name}.part"), progress)
    for final in reversed(finals):
        part = final.with_name(f".{final.name}.part")
        if part.exists():
            os.replace(part, final)
    return finals


def run_pull(args: argparse.Namespace) -> int:
    folder = args.dir if args.dir is not None else models_dir()
    try:
        paths = pull(args.model, folder, mmproj=args.mmproj, revision=args.revision)
    except (spec.PullError, hub.HubError) as e:
        _say(f"cannot pull {args.model}: {e}")
        return EXIT_FAILED
    except OSError as e:
        _say(f"cannot pull {args.model}: {e}")
        return EXIT_FAILED
    _say(f"pulled {', '.join(p.name for p in paths)} into {folder}")
    print(f"serve it:            modelyard serve -m {paths[0]}\n"
          f"or the whole folder: modelyard serve --models-dir {folder}   "
          "(a server already watching it serves it now)\n"
          f"or add it to a config: modelyard scan {folder} --update CONFIG.yaml")
    return EXIT_OK
