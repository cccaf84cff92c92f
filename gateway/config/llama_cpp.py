"""Configs written for llama-cpp-python's `--config_file` load unchanged: what that takes.

Its server and model keys that modelyard does not use (yet) are accepted with a warning; the
entry's `model_alias` is its first alias, an entry without one answers to its `model` string,
and the top-level `api_key` is one more client key that also guards the admin endpoints.
"""
from __future__ import annotations

MODEL_ALIAS = "model_alias"  # its one alias per entry: the first of ours
API_KEY = "api_key"          # its one key: a client key named "api_key" (see loader._auth)
CLIP_MODEL_PATH = "clip_model_path"  # its name for an entry's `mmproj`
LORA_PATH = "lora_path"  # its one adapter: an entry's `lora: [{path: ..., scale: 1}]`
# its rope_scaling_type is llama.cpp's enum llama_rope_scaling_type (3, longrope, comes only from
# a file's own rope_factors tensors here)
ROPE_SCALING_BY_NUMBER: dict[int, str | None] = {-1: None, 0: "none", 1: "linear", 2: "yarn"}
# Its speculative decoding: any `draft_model` value means prompt lookup (its server builds a
# LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=draft_model_num_pred_tokens)).
DRAFT_MODEL = "draft_model"
DRAFT_MODEL_N = "draft_model_num_pred_tokens"
DRAFT_KEYS = (DRAFT_MODEL, DRAFT_MODEL_N)
DRAFT_MODEL_N_DEFAULT = 10
DRAFT_MODEL_NGRAM_MAX = 2

# llama-cpp-python's ServerSettings and ModelSettings keys that modelyard does not use (yet), as
# of its 0.3.36 (tests/data/llama_cpp_python/config_file.json holds every key it has).
LLAMA_CPP_SERVER_KEYS = frozenset({
    "ssl_keyfile", "ssl_certfile", "interrupt_requests", "disable_ping_events",
    "root_path",
})
LLAMA_CPP_MODEL_KEYS = frozenset({
    "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "vocab_only", "use_mmap",
    "use_mlock", "kv_overrides", "rpc_servers", "n_batch", "n_ubatch", "n_threads_batch",
    "mul_mat_q", "logits_all", "embedding", "offload_kqv", "last_n_tokens_size", "lora_base",
    "numa",
    "hf_tokenizer_config_path", "hf_pretrained_model_name_or_path", "hf_model_repo_id",
    "verbose",
    "chat_template_kwargs",
})
_SERVER_KEY_NOTES = {
    "ssl_keyfile": "TLS is not served yet: put a reverse proxy in front for HTTPS",
    "ssl_certfile": "TLS is not served yet: put a reverse proxy in front for HTTPS",
}
UNUSED = "accepted for llama-cpp-python compatibility; not used by modelyard yet"


def server_key_note(key: str) -> str:
    """The warning for one of LLAMA_CPP_SERVER_KEYS."""
    return "accepted for llama-cpp-python compatibility; " + _SERVER_KEY_NOTES.get(
        key, "not used by modelyard yet")
