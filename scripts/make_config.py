"""Write a modelyard config serving every GGUF model under a folder (the same as `modelyard scan`).

    python scripts/make_config.py DIR [-o FILE] [--format yaml|toml|json] [--force]
    python scripts/make_config.py DIR --update FILE

Model headers are read, never their weights. Files that cannot be served are listed on stderr
with the reason. See gateway/scan/.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout

from gateway.scan import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="make_config.py"))
