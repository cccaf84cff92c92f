"""Where llama.cpp's reference outputs live: ../shared/refs/smollm2 beside the checkout (CI lays
a copy of shared/ next to its clone, as the developers' machines have it)."""
from pathlib import Path

REFS_DIR = Path(__file__).resolve().parents[2] / "shared" / "refs" / "smollm2"
