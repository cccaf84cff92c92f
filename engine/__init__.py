"""modelyard's in-process inference engine for llama-family GGUF models.

    model = engine.load("model.gguf", n_ctx=2048, n_threads=2)
    ids = model.tokenizer.encode(text, add_special=False, parse_special=True)
    for token in model.generate(ids, max_tokens=64, temperature=0.0): ...
    model.close()
"""
from .api import Model, estimate_memory, load
from .constraint import Constraint, ConstraintError, TokenizerAdapter
from .gguf import ModelLoadError
from .lora import LoraSpec
from .model import ContextOverflowError
from .prompt import EmbeddingSpan, Prompt, TokenSpan
from .rope_settings import RopeSettings
from .sampling import Sampled, SamplingParams

__all__ = ["Constraint", "ConstraintError", "ContextOverflowError", "EmbeddingSpan", "LoraSpec",
           "Model", "ModelLoadError", "Prompt", "RopeSettings", "Sampled", "SamplingParams", "TokenSpan",
           "TokenizerAdapter", "estimate_memory", "load"]
