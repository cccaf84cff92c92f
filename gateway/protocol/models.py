"""GET /v1/models: the model list and one model's card."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.protocol.base import _Response


class ModelExtras(_Response):
    """modelyard extra on model objects: what the registry and the file's header know."""
    aliases: list[str]            # every name of this model, the first one as logs use it
    state: str                    # unloaded, loading, ready, draining, failed
    loaded: bool
    context_length: int           # n_ctx as configured (the KV cache per request)
    n_ctx_train: int | None
    architecture: str | None
    quantization: str | None
    parameters: int | None
    images: bool = False          # the entry has an mmproj: chat image_url parts are taken
    capabilities: list[str] = Field(default_factory=lambda: ["completion"])  # or ["embedding"],
    #                               ["rerank"]: what the model is for (#32)


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "modelyard"
    # --- modelyard extras ---
    modelyard: ModelExtras | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]
