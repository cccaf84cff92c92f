import json

import openai.types as oa
import openai.types.chat as oa_chat
import pytest

from gateway import protocol as p
from gateway.protocol import RequestValidationError, param_path, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields):
    return json.dumps({**CHAT, **fields}).encode()


def rejected(model, body):
    with pytest.raises(RequestValidationError) as info:
        parse_request(model, body if isinstance(body, bytes) else json.dumps(body).encode())
    return info.value


# ------------------------------------------------------------------ requests: defaults, shapes

def test_chat_request_defaults_follow_openai():
    req = parse_request(p.ChatCompletionRequest, chat())
    assert (req.n, req.temperature, req.top_p, req.stream, req.logprobs) == (1, 1.0, 1.0, False, False)
    assert req.token_budget() is None and req.stop_list() == [] and not req.include_usage_in_stream()


def test_max_completion_tokens_wins_over_max_tokens():
    assert parse_request(p.ChatCompletionRequest, chat(max_tokens=5)).token_budget() == 5
    req = parse_request(p.ChatCompletionRequest, chat(max_tokens=5, max_completion_tokens=9))
    assert req.token_budget() == 9


def test_stop_string_or_list_and_empty_strings_dropped():
    assert parse_request(p.ChatCompletionRequest, chat(stop="\n")).stop_list() == ["\n"]
    assert parse_request(p.ChatCompletionRequest, chat(stop=["a", "", "bc"])).stop_list() == ["a", "bc"]


def test_content_parts_are_joined_for_the_template():
    body = chat(messages=[{"role": "user", "name": "ann",
                           "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": None}])
    req = parse_request(p.ChatCompletionRequest, body)
    assert req.messages[0].for_template() == {"role": "user", "content": "a\nb", "name": "ann"}
    assert req.messages[1].for_template() == {"role": "assistant", "content": ""}


def test_unknown_fields_are_ignored():
    req = parse_request(p.ChatCompletionRequest, chat(tools=[], metadata={"x": 1}))
    assert req.model == "m"


@pytest.mark.parametrize("prompt,expected", [
    ("hello", ["hello"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_completion_prompt_forms(prompt, expected):
    req = parse_request(p.CompletionRequest, json.dumps({"model": "m", "prompt": prompt}).encode())
    assert req.prompts() == expected
    assert req.token_budget() == 16  # the legacy endpoint's default


def test_completion_logprobs_zero_still_means_logprobs():
    req = parse_request(p.CompletionRequest, json.dumps({"prompt": "x", "logprobs": 0}).encode())
    assert req.wants_logprobs() and req.n_top_logprobs() == 0
    req = parse_request(p.CompletionRequest, json.dumps({"prompt": "x"}).encode())
    assert not req.wants_logprobs()


@pytest.mark.parametrize("value,expected", [("hi", ["hi"]), (["a", "b"], ["a", "b"]),
                                            ([5, 6], [[5, 6]]), ([[5], [6, 7]], [[5], [6, 7]])])
def test_embedding_input_forms(value, expected):
    req = parse_request(p.EmbeddingRequest, json.dumps({"input": value}).encode())
    assert req.inputs() == expected


# ------------------------------------------------------------------ requests: 400 with the parameter

@pytest.mark.parametrize("fields,param", [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"max_tokens": "5"}, "max_tokens"),       # strict: no string -> int coercion
    ({"max_tokens": 0}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"n": 0}, "n"),
    ({"n": p.MAX_N + 1}, "n"),
    ({"stop": 3}, "stop"),
    ({"stop": ["x"] * (p.MAX_STOP + 1)}, "stop"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 200}}, "logit_bias.5"),
    ({"top_logprobs": 2}, "top_logprobs"),     # needs logprobs: true
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"model": 7}, "model"),
])
def test_wrong_types_name_the_parameter(fields, param):
    err = rejected(p.ChatCompletionRequest, {**CHAT, **fields})
    assert err.param == param
    assert param.split("[")[0].split(".")[0] in err.message


def test_malformed_json_and_non_objects():
    err = rejected(p.ChatCompletionRequest, b'{"model": "m", "messages": [')
    assert err.param is None and "JSON" in err.message
    err = rejected(p.ChatCompletionRequest, b"[1, 2]")
    assert err.param is None and "object" in err.message
    err = rejected(p.ChatCompletionRequest, b"")
    assert err.param is None


@pytest.mark.parametrize("model,body,param", [
    (p.CompletionRequest, {"model": "m"}, "prompt"),
    (p.CompletionRequest, {"prompt": []}, "prompt"),
    (p.CompletionRequest, {"prompt": [1, "a"]}, "prompt"),
    (p.CompletionRequest, {"prompt": "x", "logprobs": 6}, "logprobs"),
    (p.EmbeddingRequest, {"input": ""}, "input"),
    (p.EmbeddingRequest, {"input": "x", "encoding_format": "hex"}, "encoding_format"),
])
def test_completion_and_embedding_errors(model, body, param):
    assert rejected(model, body).param == param


def test_param_path_drops_union_branch_labels():
    assert param_path(("messages", 0, "content", "list[TextContentPart]", 1, "text")) == \
        "messages[0].content[1].text"
    assert param_path(("stop", "str")) == "stop"
    assert param_path(("prompt", "list[list[int]]", 2, 0)) == "prompt[2][0]"
    assert param_path(()) is None


# ------------------------------------------------------------------ sampling parameters

def test_sampling_params_from_request():
    req = parse_request(p.ChatCompletionRequest, chat(
        temperature=0.5, top_p=0.9, seed=7, presence_penalty=0.5, frequency_penalty=-0.5,
        logit_bias={"12": -100, "3": 5}, logprobs=True, top_logprobs=3, top_k=40))
    s0, s1 = p.sampling_params(req, 0), p.sampling_params(req, 1)
    assert (s0.temperature, s0.top_p, s0.top_k, s0.seed, s1.seed) == (0.5, 0.9, 40, 7, 8)
    assert (s0.presence_penalty, s0.frequency_penalty) == (0.5, -0.5)
    assert s0.logit_bias == {12: -100.0, 3: 5.0} and s0.top_logprobs == 3
    unseeded = p.sampling_params(parse_request(p.ChatCompletionRequest, chat()), 3)
    assert unseeded.seed is None and unseeded.top_logprobs == 0


def test_top_p_zero_is_greedy():
    s = p.sampling_params(parse_request(p.ChatCompletionRequest, chat(top_p=0.0, temperature=1.0)))
    assert s.temperature == 0.0 and s.top_p == 1.0


# ------------------------------------------------------------------ responses fit OpenAI's own types

def _usage():
    return p.Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)


def test_chat_completion_parses_with_openai_types():
    lp = p.TokenLogprob(token="Hi", logprob=-0.1, bytes=[72, 105],
                        top_logprobs=[p.TopLogprob(token="Hi", logprob=-0.1, bytes=[72, 105])])
    ours = p.ChatCompletion(id="chatcmpl-1", created=1, model="m", usage=_usage(), choices=[
        p.ChatChoice(index=0, message=p.AssistantMessage(content="Hi"), finish_reason="stop",
                     logprobs=p.ChoiceLogprobs(content=[lp]))])
    theirs = oa_chat.ChatCompletion.model_validate(ours.model_dump(mode="json"))
    assert theirs.choices[0].message.content == "Hi"
    assert theirs.choices[0].logprobs.content[0].bytes == [72, 105]
    assert theirs.usage.total_tokens == 5


def test_chat_chunks_parse_with_openai_types():
    first = p.ChatCompletionChunk(id="c", created=1, model="m", choices=[
        p.ChunkChoice(index=0, delta=p.ChoiceDelta(role="assistant", content=""))])
    last = p.ChatCompletionChunk(id="c", created=1, model="m", choices=[], usage=_usage())
    for chunk in (first, last):
        theirs = oa_chat.ChatCompletionChunk.model_validate(json.loads(chunk.model_dump_json()))
        assert theirs.id == "c"
    assert oa_chat.ChatCompletionChunk.model_validate(last.model_dump()).usage.prompt_tokens == 3


def test_completion_and_embedding_and_models_parse_with_openai_types():
    comp = p.Completion(id="cmpl-1", created=1, model="m", usage=_usage(), choices=[
        p.CompletionChoice(index=0, text="x", finish_reason="length", logprobs=p.CompletionLogprobs(
            text_offset=[0], token_logprobs=[-1.0], tokens=["x"], top_logprobs=[{"x": -1.0}]))])
    assert oa.Completion.model_validate(comp.model_dump()).choices[0].logprobs.tokens == ["x"]
    emb = p.EmbeddingList(model="m", data=[p.Embedding(index=0, embedding=[0.5, 0.5])],
                          usage=p.EmbeddingUsage(prompt_tokens=2, total_tokens=2))
    assert oa.CreateEmbeddingResponse.model_validate(emb.model_dump()).data[0].embedding == [0.5, 0.5]
    card = p.ModelCard(id="a", created=1)
    assert oa.Model.model_validate(card.model_dump()).owned_by == "modelyard"


def test_error_body_shape():
    body = p.ErrorResponse(error=p.ErrorInfo(message="m", type="invalid_request_error",
                                             param="x", code=None, n_ctx=8)).model_dump()
    assert body == {"error": {"message": "m", "type": "invalid_request_error", "param": "x",
                              "code": None, "n_ctx": 8}}


@pytest.mark.parametrize("model, base", [
    (p.ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}),
    (p.CompletionRequest, {"prompt": "hi"}),
])
def test_too_many_stop_sequences_are_rejected_on_both_endpoints(model, base) -> None:
    body = {**base, "stop": [f"s{i}" for i in range(p.MAX_STOP + 1)]}
    with pytest.raises(RequestValidationError) as e:
        parse_request(model, json.dumps(body).encode())
    assert e.value.param == "stop"
    ok = {**base, "stop": [f"s{i}" for i in range(p.MAX_STOP)]}
    assert parse_request(model, json.dumps(ok).encode()).stop_list() == ok["stop"]


# ------------------------------------------------------------------ nullable fields

def test_fields_the_spec_allows_as_null_take_their_defaults():
    # OpenAI's spec marks these nullable; official clients send null for "not given"
    req = parse_request(p.ChatCompletionRequest, chat(
        stream=None, logprobs=None, n=None, temperature=None, top_p=None, stop=None,
        presence_penalty=None, frequency_penalty=None, max_tokens=None, stream_options=None,
        top_logprobs=None, seed=None, logit_bias=None, user=None))
    assert (req.stream, req.logprobs, req.n, req.temperature, req.top_p) == (
        False, False, 1, 1.0, 1.0)
    req = parse_request(p.CompletionRequest, json.dumps(
        {"model": "m", "prompt": None, "echo": None, "logprobs": None, "stream": None,
         "max_tokens": None}).encode())
    assert (req.prompt, req.echo, req.logprobs, req.stream, req.max_tokens) == (
        "<|endoftext|>", False, None, False, p.COMPLETION_DEFAULT_MAX_TOKENS)


def test_null_does_not_stand_in_for_a_required_field():
    assert rejected(p.ChatCompletionRequest, {"model": "m", "messages": None}).param == "messages"
    assert rejected(p.CompletionRequest, {"model": "m"}).param == "prompt"
