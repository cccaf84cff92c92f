"""modelyard's in-process inference engine for llama-family GGUF models."""
