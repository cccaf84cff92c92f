"""The config generator: models found from headers, unfit files skipped with a reason, configs that
load and serve, and --update that keeps the user's text.

Expectations come from elsewhere: gguf-py's own GGUFReader for tensor counts, read_header's own
error for a truncated file, `load_config` for every written config, the real app for serving.
"""
from __future__ import annotations

import difflib
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from engine.gguf import ModelLoadError, read_header
from gateway.config import load_config
from gateway.scan import FoundModel, assign_aliases, clean_name, format_count, main, scan_dir
from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama

Q = GGMLQuantizationType
SPLIT_PARTS = ["split-00001-of-00003.gguf", "split-00002-of-00003.gguf",
               "split-00003-of-00003.gguf"]


# ------------------------------------------------------------------ model files

def write_split_llama(folder: Path, stem: str = "split", **kwargs: object) -> list[Path]:
    """A tiny llama written by gguf-py in three parts (20 tensors, at most 7 per part)."""
    write_tiny_llama(folder / f"{stem}.gguf", split_max_tensors=7, **kwargs)  # type: ignore[arg-type]
    parts = sorted(folder.glob(f"{stem}-*-of-*.gguf"))
    assert len(parts) == 3
    return parts


def write_mmproj(path: Path) -> Path:
    w = GGUFWriter(str(path), "clip")
    w.add_type("mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_tensor("v.patch_embd.weight", np.zeros((8, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_truncated(path: Path, source: Path) -> Path:
    data = source.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def n_elements(*paths: Path) -> int:
    """Parameter count by gguf-py's reader, independent of engine.gguf."""
    return sum(int(t.n_elements) for p in paths for t in GGUFReader(p).tensors)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two models, a three-part split model, a text file, a truncated .gguf, an mmproj."""
    d = tmp_path_factory.mktemp("models")
    (d / "sub").mkdir()
    write_tiny_llama(d / "tiny-a.Q8_0.gguf", qtype=Q.Q8_0, name="Tiny Alpha", seed=1)
    write_tiny_llama(d / "sub" / "beta-model.Q4_0.gguf", qtype=Q.Q4_0, name="Tiny Beta",
                     seed=2, n_ctx_train=8192, chat_template=None)
    write_split_llama(d, name="Split Llama", seed=3, n_ctx_train=512)
    (d / "notes.txt").write_text("not a model\n")
    write_truncated(d / "broken.gguf", d / "tiny-a.Q8_0.gguf")
    write_mmproj(d / "vision.gguf")
    return d


# ------------------------------------------------------------------ scanning

def test_scan_finds_the_models_and_skips_the_rest_with_reasons(model_dir: Path) -> None:
    result = scan_dir(model_dir)
    by_name = {m.path.name: m for m in result.found}
    assert set(by_name) == {"tiny-a.Q8_0.gguf", "beta-model.Q4_0.gguf", SPLIT_PARTS[0]}

    a, b, s = (by_name[n] for n in ("tiny-a.Q8_0.gguf", "beta-model.Q4_0.gguf", SPLIT_PARTS[0]))
    assert (a.name, a.stem, a.arch, a.n_ctx_train, a.has_chat_template) == (
        "Tiny Alpha", "tiny-a.Q8_0", "llama", 256, True)
    assert (b.n_ctx_train, b.has_chat_template) == (8192, False)
    # ggufgen writes Q8_0's GGML type id as general.file_type (which names Q5_0): the tensors win
    assert (a.quantization, b.quantization, s.quantization) == ("Q8_0", "Q4_0", "Q8_0")
    assert a.n_params == n_elements(a.path)
    assert (s.stem, s.n_parts, s.name) == ("split", 3, "Split Llama")
    assert s.n_params == n_elements(*(model_dir / p for p in SPLIT_PARTS)) == a.n_params

    reasons = {s.path.name: s.reason for s in result.skipped}
    assert set(reasons) == {"notes.txt", "broken.gguf", "vision.gguf"}
    assert reasons["notes.txt"] == "not a GGUF file"
    with pytest.raises(ModelLoadError) as truncated:
        read_header(model_dir / "broken.gguf")
    assert reasons["broken.gguf"] == truncated.value.problem
    assert "mmproj" in reasons["vision.gguf"]


def test_symlink_loops_fifos_and_dangling_links_are_skipped_and_said(tmp_path: Path) -> None:
    import os

    write_tiny_llama(tmp_path / "real.gguf")
    (tmp_path / "loop-a.gguf").symlink_to(tmp_path / "loop-b.gguf")
    (tmp_path / "loop-b.gguf").symlink_to(tmp_path / "loop-a.gguf")
    (tmp_path / "gone.gguf").symlink_to(tmp_path / "nowhere.gguf")
    os.mkfifo(tmp_path / "pipe.gguf")  # opening it would block the scan forever
    result = scan_dir(tmp_path)
    assert [m.path.name for m in result.found] == ["real.gguf"]
    reasons = {s.path.name: s.reason for s in result.skipped}
    assert reasons == {"gone.gguf": "a dangling symlink (its target does not exist)",
                       "loop-a.gguf": "a symlink loop (it never reaches a file)",
                       "loop-b.gguf": "a symlink loop (it never reaches a file)",
                       "pipe.gguf": "a FIFO (named pipe), not a file: not opened"}


def test_split_model_with_a_missing_or_truncated_part_is_skipped(tmp_path: Path) -> None:
    parts = write_split_llama(tmp_path, stem="gone")
    parts[1].unlink()
    cut = write_split_llama(tmp_path, stem="cut")
    write_truncated(cut[2], cut[2])
    result = scan_dir(tmp_path)
    assert result.found == []
    reasons = {s.path.name: s.reason for s in result.skipped}
    assert reasons["gone-00001-of-00003.gguf"] == "split model gone: part 2 of 3 missing"
    assert reasons["cut-00001-of-00003.gguf"].startswith("part 3 of 3: ")
    assert "beyond the end of the file" in reasons["cut-00001-of-00003.gguf"]


def test_split_parts_in_the_wrong_order_are_skipped(tmp_path: Path) -> None:
    one, two, _ = write_split_llama(tmp_path)
    one.rename(tmp_path / "swap")
    two.rename(one)
    (tmp_path / "swap").rename(two)
    (skip,) = scan_dir(tmp_path).skipped
    assert skip.reason == "part 1 of 3 says it is part 2 of 3: the parts do not belong together"


def test_split_part_renamed_away_from_the_pattern_is_skipped(tmp_path: Path) -> None:
    parts = write_split_llama(tmp_path)
    parts[0].rename(tmp_path / "first.gguf")
    parts[1].rename(tmp_path / "second.gguf")
    parts[2].unlink()
    reasons = {s.path.name: s.reason for s in scan_dir(tmp_path).skipped}
    assert "part 1 of a 3-part split model" in reasons["first.gguf"]
    assert "part 2 of a 3-part split model" in reasons["second.gguf"]


def test_unservable_gguf_files_are_skipped(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "mmproj-tiny-f16.gguf")     # named as a projector
    w = GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")     # an architecture the engine lacks
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (tmp_path / "fake.gguf").write_text("plain text pretending to be a model\n")
    (tmp_path / "garbage.gguf").write_bytes(b"GGUF" + bytes(range(60)))
    (tmp_path / ".hidden.gguf").write_text("never looked at\n")
    reasons = {s.path.name: s.reason for s in scan_dir(tmp_path).skipped}
    assert set(reasons) == {"mmproj-tiny-f16.gguf", "gpt2.gguf", "fake.gguf", "garbage.gguf"}
    assert "mmproj" in reasons["mmproj-tiny-f16.gguf"]
    assert "unsupported architecture 'gpt2'" in reasons["gpt2.gguf"]
    assert reasons["fake.gguf"] == "not a GGUF file (despite its name)"
    with pytest.raises(ModelLoadError) as garbage:
        read_header(tmp_path / "garbage.gguf")
    assert reasons["garbage.gguf"] == garbage.value.problem


@pytest.mark.parametrize("n, shown", [(0, "0"), (999, "999"), (1234, "1.23K"), (57_300, "57.3K"),
                                      (999_999, "1M"), (134_515_008, "135M"),
                                      (1_700_000_000, "1.7B")])
def test_format_count(n: int, shown: str) -> None:
    assert format_count(n) == shown


# ------------------------------------------------------------------ naming

@pytest.mark.parametrize("text, name", [
    ("SmolLM2-135M-Instruct.Q4_K_M", "smollm2-135m-instruct"),
    ("Llama 3.2 1B Instruct", "llama-3.2-1b-instruct"),
    ("tiny_llama-IQ4_XS", "tiny-llama"),
    ("model-f16", "model"),
    ("Qwen2.5 0.5B", "qwen2.5-0.5b"),
    ("  ", ""),
])
def test_clean_name(text: str, name: str) -> None:
    assert clean_name(text) == name


def found(stem: str, name: str | None, quant: str = "Q8_0") -> FoundModel:
    return FoundModel(path=Path(f"/m/{stem}.gguf"), stem=stem, name=name, arch="llama",
                      n_params=1, quantization=quant, n_ctx_train=256, has_chat_template=True)


def test_aliases_come_from_the_file_name_unless_it_says_nothing() -> None:
    models = [found("tiny.Q8_0", "Ignored Name"),
              found("tiny.Q4_0", None, "Q4_0"),
              found("Tiny-Q4_0", None, "Q4_0"),
              found("ggml-model-Q4_0", "Tiny Gamma", "Q4_0"),
              found("sha256-" + "ab" * 32, "Hashed"),
              found("model", None),
              found("Other", None)]
    aliases = assign_aliases(models, taken=["other"])
    assert aliases == [["tiny", "tiny.Q8_0"],
                       ["tiny-q4_0", "tiny.Q4_0"],
                       ["tiny-q4_0-2"],                 # its stem is tiny-q4_0, ignoring case
                       ["tiny-gamma", "ggml-model-Q4_0"],
                       ["hashed", "sha256-" + "ab" * 32],
                       ["model"],
                       ["other-q8_0"]]                  # 'other' was taken before
    every = [a.casefold() for names in aliases for a in names] + ["other"]
    assert len(every) == len(set(every))


# ------------------------------------------------------------------ writing configs

def raw_config(path: Path) -> dict:
    text = path.read_text()
    return {".yaml": yaml.safe_load, ".toml": tomllib.loads, ".json": json.loads}[path.suffix](text)


@pytest.fixture(scope="module", params=["yaml", "toml", "json"])
def written(request: pytest.FixtureRequest, model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cfg") / f"modelyard.{request.param}"
    assert main([str(model_dir), "-o", str(out)]) == 0
    return out


def test_written_config_loads_with_relative_paths_and_capped_context(written: Path,
                                                                     model_dir: Path) -> None:
    config = load_config(written)
    by_file = {e.model: e for e in config.models}
    a, b, s = (model_dir / "tiny-a.Q8_0.gguf", model_dir / "sub" / "beta-model.Q4_0.gguf",
               model_dir / SPLIT_PARTS[0])
    assert set(by_file) == {a.resolve(), b.resolve(), s.resolve()}
    assert by_file[a.resolve()].aliases == ["tiny-a", "tiny-a.Q8_0"]
    assert by_file[b.resolve()].aliases == ["beta-model", "beta-model.Q4_0"]
    assert by_file[s.resolve()].aliases == ["split"]
    # n_ctx: the default 4096, capped at what each model was trained for
    assert [by_file[p.resolve()].n_ctx for p in (a, b, s)] == [256, 4096, 512]
    for item in raw_config(written)["models"]:
        assert not Path(item["model"]).is_absolute()
        assert (written.parent / item["model"]).resolve() in by_file


def test_yaml_and_toml_entries_carry_a_comment(written: Path, model_dir: Path) -> None:
    if written.suffix == ".json":
        assert "#" not in written.read_text()
        return
    lines = written.read_text().splitlines()
    n = n_elements(model_dir / "tiny-a.Q8_0.gguf")
    comment = f"# llama, {format_count(n)} params, Q8_0, chat template: yes"
    at = next(i for i, line in enumerate(lines) if line.strip() == comment)
    # the comment sits right above the entry it describes
    following = "\n".join(lines[at + 1:at + 3])
    assert "tiny-a.Q8_0.gguf" in following
    assert any(line.strip() == "# llama, " + f"{format_count(n)} params, Q4_0, "
               "chat template: no (built-in 'chatml')" for line in lines)  # ChatML tokens
    assert any("Q8_0, split in 3 parts, chat template: yes" in line for line in lines)


def test_written_config_serves_every_model(apps: Apps, written: Path, model_dir: Path) -> None:
    config = load_config(written)
    served = config.models
    assert len(served) == 3  # both models and the split one
    assert (model_dir / SPLIT_PARTS[0]).resolve() in {e.model for e in served}
    client = apps.client(config)
    listed = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert listed == config.aliases()
    for entry in served:
        for alias in entry.aliases:
            r = client.post("/v1/chat/completions", json={
                "model": alias, "max_tokens": 3, "temperature": 0,
                "messages": [{"role": "user", "content": "hello there"}]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model"] == alias
            assert body["usage"]["completion_tokens"] >= 1


def test_stdout_config_has_absolute_paths(model_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(model_dir), "--format", "toml"]) == 0
    captured = capsys.readouterr()
    out = tmp_path / "elsewhere.toml"
    out.write_text(captured.out)
    config = load_config(out)
    assert {e.model.name for e in config.models} == {"tiny-a.Q8_0.gguf", "beta-model.Q4_0.gguf",
                                                     SPLIT_PARTS[0]}
    assert all(Path(m["model"]).is_absolute() for m in tomllib.loads(captured.out)["models"])
    assert "skipped notes.txt: not a GGUF file" in captured.err
    assert "skipped vision.gguf: a vision projector (mmproj)" in captured.err
    assert "skipped broken.gguf: " in captured.err


def test_many_non_gguf_files_in_a_folder_take_one_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    write_tiny_llama(tmp_path / "tiny.gguf")
    (tmp_path / "cache").mkdir()
    for i in range(5):
        (tmp_path / "cache" / f"k{i}.o").write_bytes(b"\x7fELF")
    (tmp_path / "cache" / "fake.gguf").write_text("text")
    (tmp_path / "a.txt").write_text("text")
    assert main([str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[:3] == ["skipped a.txt: not a GGUF file",
                       "skipped cache/fake.gguf: not a GGUF file (despite its name)",
                       "skipped 5 files in cache/ that are not GGUF (k0.o, k1.o, ...)"]
    assert err[3].endswith("1 model (tiny); 7 files skipped")


def test_file_names_with_dollar_braces_stay_literal(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "odd ${HOME} name.gguf", name="")
    out = tmp_path / "c.yaml"
    assert main([str(tmp_path), "-o", str(out)]) == 0
    config = load_config(out)
    assert config.models[0].model == (tmp_path / "odd ${HOME} name.gguf").resolve()
    assert config.aliases() == ["odd-home-name", "odd ${HOME} name"]


# ------------------------------------------------------------------ arguments

def test_bad_arguments_are_explained(model_dir: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "have.yaml"
    existing.write_text("keep: me\n")
    cases = [
        ([str(model_dir), "-o", str(existing)], "exists: use --update"),
        ([str(model_dir), "-o", str(tmp_path / "c.yaml"), "--format", "json"], "does not match"),
        ([str(model_dir), "-o", str(tmp_path / "c.cfg")], "must end in"),
        ([str(model_dir), "--update", str(tmp_path / "none.yaml")], "no such config"),
        ([str(tmp_path / "nowhere"), "-o", str(tmp_path / "c.yaml")], "not a folder"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    assert existing.read_text() == "keep: me\n"
    assert not (tmp_path / "c.yaml").exists()


def test_a_folder_without_models_writes_nothing(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "readme.txt").write_text("hi")
    assert main([str(tmp_path / "m"), "-o", str(tmp_path / "c.yaml")]) == 1
    assert "no servable GGUF model" in capsys.readouterr().err
    assert not (tmp_path / "c.yaml").exists()


def test_force_overwrites(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    out.write_text("{}")
    assert main([str(model_dir), "-o", str(out), "--force"]) == 0
    assert len(load_config(out).models) == 3


# ------------------------------------------------------------------ --update

@pytest.fixture
def two_models(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    write_tiny_llama(d / "tiny-a.Q8_0.gguf", qtype=Q.Q8_0, name="Tiny Alpha", seed=1)
    write_tiny_llama(d / "beta.Q4_0.gguf", qtype=Q.Q4_0, name="Tiny Beta", seed=2)
    return d


HAND_EDITS = {
    # the user renames tiny-a to the name the split model would want, sets n_ctx, adds notes
    "yaml": [("aliases: [tiny-a, tiny-a.Q8_0]\n    n_ctx: 256",
              "aliases: [split, my-tiny]  # mine\n    n_ctx: 128"),
             ("models:\n", "# my note\nmodels:\n")],
    "toml": [('aliases = ["tiny-a", "tiny-a.Q8_0"]\nn_ctx = 256',
              'aliases = ["split", "my-tiny"]  # mine\nn_ctx = 128'),
             ("[[models]]", "# my note\n[[models]]", 1)],
    "json": [('[\n        "tiny-a",\n        "tiny-a.Q8_0"\n      ],\n      "n_ctx": 256',
              '["split", "my-tiny"],\n      "n_ctx": 128')],
}


def hand_edit(path: Path, fmt: str) -> str:
    text = path.read_text()
    for old, new, *count in HAND_EDITS[fmt]:
        assert old in text, (old, text)
        text = text.replace(old, new, *count)
    path.write_text(text)
    return text


@pytest.mark.parametrize("fmt", ["yaml", "toml", "json"])
def test_update_keeps_hand_edits_and_appends_new_models(
        fmt: str, two_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"modelyard.{fmt}"
    assert main([str(two_models), "-o", str(out)]) == 0
    edited = hand_edit(out, fmt)
    before = load_config(out)
    tiny = before.resolve("my-tiny")
    assert tiny.aliases == ["split", "my-tiny"] and tiny.n_ctx == 128

    write_split_llama(two_models, name="Split Llama", seed=3)
    write_tiny_llama(two_models / "my-tiny.Q4_0.gguf", qtype=Q.Q4_0, seed=4)
    capsys.readouterr()
    assert main([str(two_models), "--update", str(out)]) == 0
    err = capsys.readouterr().err
    assert "2 models already in" in err

    after = load_config(out)
    assert after.models[:2] == before.models  # the user's entries, edits and all, unchanged
    assert after.resolve("my-tiny").n_ctx == 128
    new = after.models[2:]
    assert [e.model.name for e in new] == ["my-tiny.Q4_0.gguf", SPLIT_PARTS[0]]
    # the user took 'split' and 'my-tiny': the quantization tells the newcomers apart
    assert [e.aliases for e in new] == [["my-tiny-q4_0", "my-tiny.Q4_0"], ["split-q8_0"]]
    text = out.read_text()
    if fmt == "json":
        assert json.loads(text)["models"][:2] == json.loads(edited)["models"]
    else:
        assert text.startswith(edited)  # not a byte of the user's text changed
        assert "# mine" in text and "# my note" in text
        assert not out.with_name(out.name + ".bak").exists()

    # nothing new: the file stays byte for byte
    assert main([str(two_models), "--update", str(out)]) == 0
    assert "is unchanged" in capsys.readouterr().err
    assert out.read_text() == text


def test_update_inserts_into_a_yaml_list_that_is_not_last(two_models: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    original = (
        "# top comment\n"
        "models:\n"
        "- model: models/tiny-a.Q8_0.gguf   # indentless list\n"
        "  aliases: [mine]\n"
        "# - model: models/old.gguf  (commented out)\n"
        "\n"
        "# registry: one model at a time\n"
        "registry:\n"
        "  max_loaded_models: 1\n"
    )
    out.write_text(original)
    assert main([str(two_models), "--update", str(out)]) == 0
    text = out.read_text()
    config = load_config(out)
    assert [e.aliases for e in config.models] == [["mine"], ["beta", "beta.Q4_0"]]
    assert config.registry.max_loaded_models == 1
    lines = text.splitlines(keepends=True)
    # only insertions, in one place: before the comment that belongs to `registry`
    ops = difflib.SequenceMatcher(None, original.splitlines(keepends=True), lines,
                                  autojunk=False).get_opcodes()
    inserts = [(j1, j2) for tag, _, _, j1, j2 in ops if tag != "equal"]
    assert [tag for tag, *_ in ops if tag != "equal"] == ["insert"]
    (j1, j2), = inserts
    assert any(line.startswith("- model: models/beta.Q4_0.gguf") for line in lines[j1:j2])
    assert j2 <= lines.index("# registry: one model at a time\n")


def test_update_fills_an_empty_yaml_models_key(two_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    out.write_text("models:   # none yet\nregistry:\n  max_loaded_models: 1\n"
                   "defaults:\n  n_ctx: 128\n")
    assert main([str(two_models), "--update", str(out)]) == 0
    config = load_config(out)
    assert len(config.models) == 2 and config.registry.max_loaded_models == 1
    assert [e.n_ctx for e in config.models] == [128, 128]  # the file's default, under 256
    assert "# none yet" in out.read_text()


def test_update_rewrites_inline_toml_models_and_keeps_a_backup(
        two_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.toml"
    original = ('# inline\nport = 9000\nmodels = [{ model = "models/tiny-a.Q8_0.gguf", '
                'aliases = ["mine"], n_ctx = 64 }]\n\n[registry]\nmax_loaded_models = 1\n')
    out.write_text(original)
    assert main([str(two_models), "--update", str(out)]) == 0
    assert "comments are lost" in capsys.readouterr().err
    assert out.with_name("c.toml.bak").read_text() == original
    config = load_config(out)
    assert config.port == 9000 and config.registry.max_loaded_models == 1
    assert [(e.aliases, e.n_ctx) for e in config.models] == [
        (["mine"], 64), (["beta", "beta.Q4_0"], 256)]


def test_update_of_an_invalid_config_still_appends_and_warns(
        two_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.yaml"
    shutil.copy(two_models / "tiny-a.Q8_0.gguf", tmp_path / "gone.gguf")
    out.write_text("models:\n  - model: gone.gguf\n    aliases: [gone]\n")
    (tmp_path / "gone.gguf").unlink()  # the user deleted a model the config lists
    assert main([str(two_models), "--update", str(out)]) == 0
    assert "had problems before this update" in capsys.readouterr().err
    data = yaml.safe_load(out.read_text())
    assert [m["aliases"][0] for m in data["models"]] == ["gone", "beta", "tiny-a"]


def test_unparsable_config_is_not_touched(two_models: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.yaml"
    out.write_text("models: [\n")
    assert main([str(two_models), "--update", str(out)]) == 2
    assert "cannot parse it as YAML" in capsys.readouterr().err
    assert out.read_text() == "models: [\n"


def test_update_rewrites_a_yaml_flow_list_and_keeps_a_backup(two_models: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "c.yml"
    original = "port: 9000  # mine\nmodels: [{model: models/beta.Q4_0.gguf, aliases: [b]}]\n"
    out.write_text(original)
    assert main([str(two_models), "--update", str(out)]) == 0
    assert out.with_name("c.yml.bak").read_text() == original
    config = load_config(out)
    assert config.port == 9000
    assert [e.aliases for e in config.models] == [["b"], ["tiny-a", "tiny-a.Q8_0"]]
    assert "# llama, " in out.read_text()  # the new entry still gets its comment
