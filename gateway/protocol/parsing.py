"""Raw JSON -> a validated request (a 400 naming the parameter otherwise), request fields ->
engine sampling parameters, and the ids and timestamps responses carry."""
from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest

if TYPE_CHECKING:
    import engine

GenerationRequestBody = ChatCompletionRequest | CompletionRequest
R = TypeVar("R", bound=BaseModel)


class RequestValidationError(Exception):
    """A request body that is not JSON or does not fit the schema; `param` names the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _is_union_tag(part: str) -> bool:
    # pydantic labels union branches with type names ('str', 'list[int]', 'TextContentPart');
    # our field names are lower snake_case, so anything else is a tag, not a path step.
    return "[" in part or part in {"str", "int", "float", "bool", "none"} or part[:1].isupper()


def param_path(loc: tuple[int | str, ...]) -> str | None:
    """('messages', 0, 'str', 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += f".{part}" if out else part
    return out or None


def parse_request(model: type[R], body: bytes) -> R:
    """Validate a raw JSON body; raises RequestValidationError (-> 400) on any problem."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        if first["type"] == "json_invalid":
            raise RequestValidationError(f"We could not parse the JSON body of your request: {first['msg']}",
                                         None) from None
        param = param_path(first["loc"])
        details: list[str] = []
        for err in errors:
            where = param_path(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            text = f"'{where}': {msg}" if where else msg
            if text not in details:
                details.append(text)
        message = "Invalid request: " + "; ".join(details[:4])
        if len(details) > 4:
            message += f" (and {len(details) - 4} more)"
        raise RequestValidationError(message, param) from None


def sampling_params(req: GenerationRequestBody, choice: int = 0) -> engine.SamplingParams:
    """Request fields -> engine sampling parameters for choice number `choice`.

    Choices of one request get seeds seed, seed+1, ... so `n` > 1 with a seed gives n different
    but reproducible answers.
    """
    import engine

    seed = None if req.seed is None else req.seed + choice
    greedy = req.top_p == 0.0  # OpenAI allows top_p 0: only the most likely token survives
    return engine.SamplingParams(
        temperature=0.0 if greedy else req.temperature,
        top_k=req.top_k,
        top_p=1.0 if greedy else req.top_p,
        min_p=req.min_p,
        repeat_penalty=req.repeat_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
        seed=seed,
        top_logprobs=req.n_top_logprobs(),
        logprobs=req.wants_logprobs(),
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
