import json
from datetime import datetime
from pathlib import Path

import pytest

from engine.chat import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from tests.support.refs import REFS_DIR

REFS = REFS_DIR / "greedy.json"


def _gguf_string(path: Path, key: str) -> str:
    """A string field read with gguf-py directly, independent of our engine's reader."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields[key]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


@pytest.mark.real_model
def test_smollm2_template_from_gguf_matches_llama_cpp_prompt(smollm2_path):
    ref = json.loads(REFS.read_text())["chat"]
    source = _gguf_string(smollm2_path, "tokenizer.chat_template")
    rendered = ChatTemplate(source).render(ref["messages"])
    assert rendered == ref["templated_prompt"]


def test_chatml_fallback_when_model_has_no_template():
    template = ChatTemplate.for_model(None, ["<unk>", "<s>", "</s>"], 1, 2)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert template.source == CHATML_TEMPLATE
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_bos_and_eos_texts_come_from_the_vocabulary():
    template = ChatTemplate.for_model("{{ bos_token }}|{{ eos_token }}", ["<unk>", "<s>", "</s>"], 1, 2)
    assert template.render([]) == "<s>|</s>"
    missing = ChatTemplate.for_model("[{{ bos_token }}]", ["a"], None, 7)
    assert missing.render([]) == "[]"


def test_blocks_are_trimmed_like_transformers():
    source = ("{% for m in messages %}\n  {{ m['content'] }}\n  {% if loop.last %}\nend\n  {% endif %}\n"
              "{% endfor %}")
    out = ChatTemplate(source).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert out == "  a\n  b\nend\n"


def test_tojson_is_not_html_escaped_and_keeps_unicode():
    value = {"q": "<a & 'b'> é"}
    out = ChatTemplate("{{ messages[0] | tojson }}").render([value])
    assert out == json.dumps(value, ensure_ascii=False)
    out = ChatTemplate("{{ messages[0] | tojson(indent=2) }}").render([value])
    assert out == json.dumps(value, ensure_ascii=False, indent=2)


def test_raise_exception_becomes_chat_template_error():
    source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ChatTemplate(source).render([{"role": "assistant", "content": "x"}])


def test_sandbox_blocks_python_internals_and_mutation():
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set xs = [] %}{{ xs.append(1) }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.pop() }}").render([{"role": "user", "content": "x"}])


def test_template_bugs_are_reported_not_crashes():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ 'a' + messages[0]['content'] }}").render([{"role": "user", "content": None}])


def test_generation_block_loopcontrols_tools_and_strftime():
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}"
        "{{ tools is none }}|{{ strftime_now('%Y') }}"
    )
    before = datetime.now().strftime("%Y")
    out = ChatTemplate(source).render([{"role": "user", "content": "one"},
                                       {"role": "user", "content": "two"}])
    assert out in (f"[one]True|{before}", f"[one]True|{datetime.now().strftime('%Y')}")


def test_templates_get_llama_cpps_date_variables():
    """llama.cpp gives every template today's date as `date_string` ("%d %b %Y", Llama 3.x)
    and `datetime` ("%b %d %Y", FireFunction): common/chat.cpp common_chat_extra_context."""
    source = (Path(__file__).parent.parent / "data" / "templates" /
              "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()
    today = datetime.now()
    prompt = ChatTemplate(source).render([{"role": "user", "content": "What is today?"}])
    assert f"Today Date: {today.strftime('%d %b %Y')}\n" in prompt
    assert "26 Jul 2024" not in prompt  # the template's own fallback
    fire = ChatTemplate("Today is {{ datetime }}.").render([])
    assert fire == f"Today is {today.strftime('%b %d %Y')}."
    mine = ChatTemplate("{{ date_string }}").render([], variables={"date_string": "1 Jan 2000"})
    assert mine == "1 Jan 2000"  # a request's chat_template_kwargs still win
