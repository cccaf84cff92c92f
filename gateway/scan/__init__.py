"""`modelyard scan`: write a config serving every GGUF model under a folder, from headers alone.

    modelyard scan DIR [-o FILE] [--format yaml|toml|json] [--force]
    modelyard scan DIR --update FILE

    walk DIR -> group split parts -> read headers (never weights) -> Found | Skipped (reason)
    -> name them (unique aliases) -> render YAML/TOML/JSON -> check with load_config -> write

A written config loads with `load_config` as it is: model paths are relative to the output file
(absolute on stdout), every entry has aliases and an `n_ctx` no larger than the model was trained
for, and YAML/TOML entries carry a comment line (architecture, parameters, quantization, chat
template). A vision projector (mmproj) beside the model it fits is written as that entry's
`mmproj`. Files that cannot be served (not GGUF, truncated, projectors that pair with no model,
adapters, architectures the engine lacks) are skipped with their reason on stderr.

`--update FILE` keeps FILE's text as the user left it and adds only models it does not list yet
(compared by resolved path), with aliases unique against the ones it has. YAML and TOML entries
are appended to the text; when that is impossible (e.g. `models = [...]` written inline) the file
is rewritten from its values, comments lost, after saving the old text as FILE.bak.

The steps live in one module each: discover.py (walk, group split parts), judge.py (headers ->
FoundModel | Skipped), pairing.py (an mmproj with its model), naming.py (aliases), render.py
(entries, YAML/TOML/JSON), update.py (`--update`), cli.py (arguments, checking with
load_config, writing).
"""

from gateway.config.formats import FORMATS
from gateway.scan.cli import EXIT_NOTHING, EXIT_OK, EXIT_USAGE, add_scan_arguments, main, run_scan
from gateway.scan.discover import ScanResult, examine_file, scan_dir
from gateway.scan.judge import NOT_GGUF, FoundModel, Skipped, format_count, quantization
from gateway.scan.naming import assign_aliases, clean_name, family_name, preferred_name
from gateway.scan.render import DEFAULT_N_CTX, HEADER, Entry, build_entries, render
from gateway.scan.update import Existing, ScanError, read_existing, updated_text

__all__ = [
    "DEFAULT_N_CTX", "EXIT_NOTHING", "EXIT_OK", "EXIT_USAGE", "FORMATS", "HEADER", "NOT_GGUF",
    "Entry", "Existing", "FoundModel", "ScanError", "ScanResult", "Skipped", "add_scan_arguments",
    "assign_aliases", "build_entries", "clean_name", "examine_file", "family_name",
    "format_count", "main", "preferred_name", "quantization", "read_existing", "render",
    "run_scan", "scan_dir", "updated_text",
]
