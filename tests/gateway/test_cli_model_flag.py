"""`serve --model FILE` / `-m FILE` mean a model file, as in llama-server (argparse once read
`--model` as an abbreviation of `--models-dir`), and command-line problems say where they come
from ("the model files on the command line"), never "invalid config the command line"."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway import cli
from tests.support.ggufgen import write_tiny_llama


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Configs `serve` would run, captured instead of serving them."""
    seen: list[Any] = []

    async def fake_serve(config: Any, socks: Any, *rest: Any) -> None:
        for sock in socks:  # the main address, then ollama_address's if configured
            sock.close()
        seen.append(config)

    monkeypatch.setattr(cli, "_serve", fake_serve)
    return seen


@pytest.mark.parametrize("flag", ["--model", "-m"])
def test_model_flag_serves_a_file(tmp_path: Path, served: list[Any], flag: str) -> None:
    path = write_tiny_llama(tmp_path / "SmolLM2-135M-Instruct.Q8_0.gguf")
    assert cli.main(["serve", flag, str(path), "--port", "0"]) == 0
    [config] = served
    assert [e.model for e in config.models] == [path.absolute()]
    assert "smollm2" in config.aliases()


def test_several_model_flags_and_positional_files_add_up(tmp_path: Path,
                                                         served: list[Any]) -> None:
    a = write_tiny_llama(tmp_path / "tiny_a.gguf", seed=1)
    b = write_tiny_llama(tmp_path / "tiny_b.gguf", seed=2)
    assert cli.main(["serve", str(a), "-m", str(b), "--port", "0"]) == 0
    assert sorted(e.model for e in served[0].models) == sorted([a.absolute(), b.absolute()])


def test_an_abbreviated_option_is_refused_not_guessed() -> None:
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["serve", "--models", "x"])  # not --models-dir


def test_a_bad_file_names_the_command_line(tmp_path: Path, served: list[Any],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model")
    assert cli.main(["serve", "-m", str(bad)]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "cannot serve the model files on the command line (1 problem)" in err
    assert str(bad) in err and "invalid config" not in err and not served


def test_a_folder_that_is_a_file_says_so(tmp_path: Path, served: list[Any],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    assert cli.main(["serve", "--models-dir", str(path)]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "models folder" in err and "not a directory" in err and "invalid config" not in err
