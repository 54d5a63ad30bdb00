"""The launch's rules on env, args, paths and images, as the spec applies them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from service.core.launch_limits import MAX_ARGS_BYTES, MAX_ENV_BYTES, MAX_ENV_VALUE_BYTES
from service.core.spec import JobSpec
from tests.integration.helpers import tiny_spec


def refusal(**changes: Any) -> tuple[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(tiny_spec(**changes))
    error = caught.value.errors()[0]
    return error["loc"], error["msg"]


def test_values_a_process_can_take_are_accepted() -> None:
    spec = JobSpec.model_validate(
        tiny_spec(
            env={"JSON": '{\n\t"a": 1\n}', "BIG": "é" * (MAX_ENV_VALUE_BYTES // 2)},
            args=["--note", "tab\there", "line\nbreak", "$(not a shell) `nor` ';"],
            image="localhost:5000/team/trainer:v1.2@sha256:" + "a" * 64,
            working_dir="/data/" + "d" * 255,
        )
    )
    assert spec.env["BIG"] == "é" * (MAX_ENV_VALUE_BYTES // 2)  # 2 bytes each: exactly the limit


@pytest.mark.parametrize(
    ("changes", "loc", "words"),
    [
        ({"env": {"X": "é" * (MAX_ENV_VALUE_BYTES // 2) + "x"}}, ("env", "X"), "32,769 bytes"),
        ({"env": {f"V{i}": "x" * 30_000 for i in range(9)}}, ("env",), f"{MAX_ENV_BYTES:,}"),
        ({"env": {"X": "\r"}}, ("env", "X"), "control characters"),
        ({"env": {"X": "\x7f"}}, ("env", "X"), "control characters"),
        ({"env": {"MASTER_ADDR": "1"}}, ("env", "MASTER_ADDR", "[key]"), "reserved"),
        ({"args": ["x" * 30_000] * 9}, ("args",), f"{MAX_ARGS_BYTES:,}"),
        ({"args": ["\x00"]}, ("args", 0), "NUL bytes"),
        ({"entrypoint": ""}, ("entrypoint",), "must not be empty"),
        ({"entrypoint": "a\tb.py"}, ("entrypoint",), "control characters"),
        ({"working_dir": "/" + "é" * 128}, ("working_dir",), "256 bytes"),
        ({"image": "trainer:"}, ("image",), "image reference"),
        ({"image": "trainer\n"}, ("image",), "control characters"),
        ({"image": "a" * 256}, ("image",), "longer than 255"),
    ],
)
def test_values_no_backend_can_launch_are_refused_naming_the_field(
    changes: dict[str, Any], loc: tuple[Any, ...], words: str
) -> None:
    where, message = refusal(**changes)
    assert where == loc
    assert words in message
