import json

import pytest
from starlette.exceptions import HTTPException

import engine
from engine.chat import ChatTemplateError
from gateway.config import ModelNotFoundError
from gateway.errors import APIError, context_length_exceeded, error_response, to_api_error
from gateway.fleet.registry import ModelLoadFailedError, RegistryBusyError
from gateway.generation.events import QueueFullError, SchedulerClosedError
from gateway.protocol import ErrorResponse, RequestValidationError


@pytest.mark.parametrize("exc,status,kind,code,param", [
    (RequestValidationError("bad n", "n"), 400, "invalid_request_error", None, "n"),
    (ModelNotFoundError("gpt-4", ["a", "b"]), 404, "invalid_request_error", "model_not_found", "model"),
    (ModelLoadFailedError("/m.gguf", "truncated"), 500, "server_error", "model_load_failed", None),
    (RegistryBusyError("busy", retry_after=2.5), 503, "server_error", "server_busy", None),
    (QueueFullError("m", 4), 503, "server_error", "server_busy", None),
    (SchedulerClosedError("m"), 503, "server_error", "server_busy", None),
    (ChatTemplateError("roles must alternate"), 400, "invalid_request_error", None, "messages"),
    (engine.ContextOverflowError(300, 256), 400, "invalid_request_error", "context_length_exceeded", None),
    (HTTPException(405), 405, "invalid_request_error", "method_not_allowed", None),
    (RuntimeError("boom"), 500, "server_error", "internal_error", None),
])
def test_every_error_becomes_an_openai_error(exc, status, kind, code, param):
    response = error_response(exc)
    body = json.loads(response.body)
    ErrorResponse.model_validate(body)
    assert response.status_code == status
    assert (body["error"]["type"], body["error"]["code"], body["error"]["param"]) == (kind, code, param)
    assert body["error"]["message"]


def test_model_not_found_names_every_alias():
    message = to_api_error(ModelNotFoundError("gpt-4", ["tiny", "smollm2"])).message
    assert "gpt-4" in message and "tiny" in message and "smollm2" in message


def test_busy_errors_say_when_to_retry():
    assert error_response(RegistryBusyError("busy", retry_after=2.5)).headers["retry-after"] == "3"
    assert error_response(QueueFullError("m", 4, retry_after=0.1)).headers["retry-after"] == "1"


def test_context_length_error_carries_the_counts():
    err = context_length_exceeded(300, 256, "messages")
    assert isinstance(err, APIError) and err.status == 400
    assert err.body()["error"] == {
        "message": err.message, "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded", "n_prompt_tokens": 300, "n_ctx": 256}
    assert to_api_error(engine.ContextOverflowError(300, 256)).extra == {"n_prompt_tokens": 300, "n_ctx": 256}


@pytest.mark.parametrize("exc", [
    RuntimeError("open('/srv/secret/models/x.gguf') failed"),
    ModelLoadFailedError("/srv/secret/models/x.gguf",
                         "ModelLoadError: /srv/secret/models/x.gguf: tensor blk.0 lies beyond "
                         "the end of the file"),
])
def test_client_facing_500s_carry_no_paths_or_class_names(exc):
    message = to_api_error(exc).message
    assert "/srv/secret" not in message
    assert "Error:" not in message and type(exc).__name__ not in message


def test_a_load_failure_still_says_what_is_wrong_with_which_file():
    message = to_api_error(ModelLoadFailedError(
        "/srv/m/x.gguf", "ModelLoadError: /srv/m/x.gguf: the file is truncated")).message
    assert message == "Model could not be loaded: x.gguf: the file is truncated"
