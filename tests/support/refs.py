"""Where llama.cpp's reference outputs live: tests/data, copied from the team's shared refs so a
fresh clone passes its tests with no sibling folders. Each folder keeps its README (how the
outputs were made and how close is close enough)."""
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
REFS_DIR = DATA_DIR / "smollm2"     # SmolLM2-135M-Instruct Q4_1
GEMMA3_DIR = DATA_DIR / "gemma3"    # Gemma 3 270M Q4_K_M
SYNTH_DIR = DATA_DIR / "synth"      # tiny random-weight models of the other families and types
SYNTH3_DIR = DATA_DIR / "synth3"    # a mixture of experts (qwen3moe), the synth3 refs' part we serve
ENCODERS_DIR = DATA_DIR / "encoders"  # tiny embedding and reranker models (bert, nomic, qwen3)
VLM_DIR = DATA_DIR / "vlm"          # tiny random-weight text models with mmproj projectors (images)
