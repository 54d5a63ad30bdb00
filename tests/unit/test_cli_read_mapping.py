"""The one reader of spec, config.json and ds_config files: bounded, alias-free, and naming the
field that pointed at the file when one did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer

from zeropilot.cli_common import MAX_FILE_BYTES, inline_hf_config, read_mapping


def refusal(path: Path, capsys: pytest.CaptureFixture[str], field: str = "") -> str:
    """The one-line error ``read_mapping`` exits 2 with."""
    with pytest.raises(typer.Exit) as exited:
        read_mapping(path, "a job spec", field)
    assert exited.value.exit_code == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("base: &base {a: 1}\nname: x\n", "line 1, column 7"),  # an anchor alone
        ("a: 1\nb: *a\n", "line 2, column 4"),  # an alias to nothing
        ("base: &b {x: 1}\njob:\n  <<: *b\n", "line 1, column 7"),  # a merge key
    ],
)
def test_anchors_and_aliases_are_refused_where_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    message = refusal(path, capsys)
    assert f"{path} holds a YAML anchor or alias ({where}): " in message
    assert "anchors and aliases (&name, *name, <<: *name) are not accepted" in message


def test_ampersands_and_stars_inside_values_are_text(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text('args: ["*.txt", "a&b", "--glob=*"]\nenv: {PATTERN: "&x"}\n')
    assert read_mapping(path, "a job spec") == {
        "args": ["*.txt", "a&b", "--glob=*"],
        "env": {"PATTERN": "&x"},
    }


def test_one_mib_is_read_and_one_byte_more_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    filler = MAX_FILE_BYTES - len("name: \n")
    path.write_text(f"name: {'x' * filler}\n")
    assert len(read_mapping(path, "a job spec")["name"]) == filler
    path.write_text(f"name: {'x' * (filler + 1)}\n")
    assert "is over 1 MiB (1,048,576 bytes), the limit for a job spec" in refusal(path, capsys)


def test_json_files_are_read_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"rms_norm_eps": 1e-05}')  # YAML 1.1 would read this number as text
    assert read_mapping(path, "a config") == {"rms_norm_eps": 1e-05}
    path.write_text("[" * 100_000)
    assert f"{path} is nested too deeply to read" in refusal(path, capsys)


def test_text_that_is_not_utf8_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    assert f"{path} is not UTF-8 text: invalid continuation byte at byte 9" in refusal(path, capsys)


def test_the_hf_config_uses_the_same_reader_and_names_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "pad": "x" * MAX_FILE_BYTES}))
    with pytest.raises(typer.Exit):
        inline_hf_config({"model": {"hf_config": "config.json"}}, tmp_path)
    message = " ".join(capsys.readouterr().err.split())
    assert f"model.hf_config: {config} is over 1 MiB" in message

    config.write_text('{"model_type": "llama", "hidden_size": 64}')
    spec: dict[str, Any] = {"model": {"hf_config": "config.json"}}
    inline_hf_config(spec, tmp_path)
    assert spec["model"] == {"hf_config": {"model_type": "llama", "hidden_size": 64}}


def test_a_path_with_brackets_is_named_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job[bold].yaml"  # not console markup
    path.write_text("a: &a 1\n")
    assert f"{path} holds a YAML anchor" in refusal(path, capsys)
