"""llama-server's telemetry on streams, in its shapes (tools/server/server-task.cpp,
server-common.cpp), for every API that carries it (`/completion`, chat, completions, Responses):

    prompt_progress   {total, cache, processed, time_ms}: a request with `return_progress` gets
                      one when its slot starts (processed == cache) and one per prompt chunk read
    timings           {cache_n, prompt_n, prompt_ms, prompt_per_token_ms, prompt_per_second,
                      predicted_n, predicted_ms, predicted_per_token_ms, predicted_per_second,
                      draft_n, draft_n_accepted (when it drafted)}: on the last chunk, and with
                      `timings_per_token` on every chunk
"""
from __future__ import annotations

from typing import Any

from gateway.generation.events import PromptProgress, Timings


def prompt_progress(event: PromptProgress) -> dict[str, int]:
    return {"total": event.total, "cache": event.cached, "processed": event.processed,
            "time_ms": int(event.seconds * 1000)}


def timings(t: Timings) -> dict[str, Any]:
    prompt_n = t.prompt_tokens - t.cached_tokens
    prompt_ms, predicted_ms = t.prompt_seconds * 1000, t.predicted_seconds * 1000
    n = t.completion_tokens
    return {"cache_n": t.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / t.prompt_seconds if t.prompt_seconds else 0.0,
            "predicted_n": n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n if n else 0.0,
            "predicted_per_second": n / t.predicted_seconds if t.predicted_seconds else 0.0,
            **({"draft_n": t.draft_n, "draft_n_accepted": t.draft_accepted}
               if t.draft_n else {})}  # llama-server's, present when it drafted
