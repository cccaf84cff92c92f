"""gateway/activity.py: the ring of per-model totals behind the console's Activity history.
Its totals agree with /metrics (the page computes the same totals from there); snapshots come at
most every STEP seconds, hold only what happened before their time, and go after WINDOW."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway import activity
from gateway.activity import ActivityHistory


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_snapshots_hold_what_happened_before_them_and_age_out() -> None:
    clock = Clock()
    h = ActivityHistory(clock)
    h.tokens("a", prompt=10, completion=5)        # first event: a snapshot of nothing at t=1000
    clock.now += 1
    h.tokens("a", prompt=1, completion=2)         # within the step: no snapshot
    clock.now += activity.STEP
    h.request("a", 200)                           # a new step: snapshot of 11/7 before it
    h.request("b", 503)
    clock.now += 1
    samples = h.history()["samples"]
    assert [s["t"] for s in samples] == [1000.0, 1000.0 + 1 + activity.STEP,
                                         1000.0 + 2 + activity.STEP]  # the last: now
    assert samples[0]["models"] == {}
    assert samples[1]["models"]["a"]["completion"] == 7 and "b" not in samples[1]["models"]
    assert samples[2]["models"]["b"] == {**dict.fromkeys(activity.FIELDS, 0.0),
                                         "requests": 1, "errors": 1}
    clock.now += activity.WINDOW + 1
    h.batch("a", 3)
    samples = h.history()["samples"]
    assert all(clock.now - s["t"] <= activity.WINDOW for s in samples)
    assert samples[-1]["models"]["a"]["batchCount"] == 1


def test_reading_often_does_not_grow_the_ring() -> None:
    clock = Clock()
    h = ActivityHistory(clock)
    for _ in range(1000):
        clock.now += 0.01
        h.history()
    assert len(h.history()["samples"]) <= 1 + 10 / activity.STEP + 1


def test_the_history_agrees_with_metrics(apps, tmp_path) -> None:
    from tests.support.ggufgen import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=5)
    client = apps.client({"models": [{"model": str(model), "aliases": ["tiny"], "n_ctx": 128}]})
    for n in (3, 5):
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": n, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
        "logit_bias": {"999999": 5}})
    assert r.status_code == 400, r.text
    last = client.get("/metrics/activity").json()["samples"][-1]["models"]["tiny"]
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.labels.get("model") != "tiny":
                continue
            key = {"modelyard_completion_tokens_total": "completion",
                   "modelyard_prompt_tokens_total": "prompt",
                   "modelyard_time_to_first_token_seconds_count": "ttftCount",
                   "modelyard_batch_size_count": "batchCount"}.get(sample.name)
            if key:
                counted[key] = counted.get(key, 0) + sample.value
            if sample.name == "modelyard_requests_total":
                counted["requests"] = counted.get("requests", 0) + sample.value
                if int(sample.labels["status"]) >= 400:
                    counted["errors"] = counted.get("errors", 0) + sample.value
    assert counted["requests"] == 3 and counted["errors"] == 1
    assert {k: last[k] for k in counted} == counted


def test_it_is_as_public_as_metrics(apps, tmp_path) -> None:
    from tests.support.ggufgen import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=5)
    client = apps.client({"models": [{"model": str(model), "aliases": ["tiny"]}],
                          "auth": {"keys": [{"name": "k", "key": "sk-1"}]}})
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics/activity").status_code == 200
    client = apps.client({"models": [{"model": str(model), "aliases": ["tiny"]}],
                          "auth": {"keys": [{"name": "k", "key": "sk-1"}], "public": []}})
    assert client.get("/metrics/activity").status_code == 401
