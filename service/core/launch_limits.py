"""What a job may hand to the launch: its environment, arguments, entrypoint, working_dir, image.

One set of rules for every backend, checked when the spec is parsed, so a value the local
supervisor, a Slurm script or a pod spec cannot carry is a 422 naming the field at submit, not
a launch that fails later as "node lost". The sizes keep argv plus environment well inside
Linux's 2 MiB ``ARG_MAX`` and a pod spec inside the API server's 1.5 MiB object limit.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

KIB = 1024
MAX_ENV_VALUE_BYTES = 32 * KIB
MAX_ENV_BYTES = 256 * KIB  # all names and values together
MAX_ENV_VARIABLES = 256
MAX_ENV_NAME = 256
MAX_ARG_BYTES = 32 * KIB
MAX_ARGS_BYTES = 256 * KIB  # all arguments together
MAX_ARGS = 1024
MAX_PATH_BYTES = 4096  # Linux PATH_MAX
MAX_PATH_COMPONENT_BYTES = 255  # NAME_MAX of every common filesystem
MAX_IMAGE_NAME = 255  # the registry's limit on a repository name

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Variables the launch sets in every rank (node rank, rendezvous, zeropilot's runtime): a job's
# own value would replace them (on Kubernetes the Job controller keeps a JOB_COMPLETION_INDEX
# the pod already has, and every node would get the same rank).
RESERVED_ENV_NAMES = frozenset({"JOB_COMPLETION_INDEX", "RANK", "LOCAL_RANK", "WORLD_SIZE"})
RESERVED_ENV_PREFIXES = ("ZEROPILOT_", "MASTER_")

# NUL ends a C string (no argv or environment entry can hold it); other control characters
# rewrite a terminal that shows the log. Tab and newline are ordinary in a value or argument.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_IN_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# An OCI image reference as registries and container runtimes parse it:
# [registry[:port]/]path[/path...][:tag][@algorithm:digest]
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}(?::[0-9]+)?/)?{_PATH}(?:/{_PATH})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?"
)


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _describe(char: str) -> str:
    return "NUL bytes" if char == "\0" else f"control characters (found {char!r})"


def plain_text(text: str) -> str:
    """An argument or environment value: any text but NUL and control characters."""
    if found := _CONTROL_IN_TEXT.search(text):
        raise ValueError(f"must not contain {_describe(found.group())}")
    return text


def no_control_characters(text: str) -> str:
    """A name or path: no control characters at all, tab and newline included."""
    if found := _CONTROL.search(text):
        raise ValueError(f"must not contain {_describe(found.group())}")
    return text


def at_most_bytes(limit: int) -> AfterValidator:
    def check(text: str) -> str:
        if (size := _utf8_size(text)) > limit:
            raise ValueError(f"is {size:,} bytes; at most {limit:,} bytes are allowed")
        return text

    return AfterValidator(check)


def file_path(text: str) -> str:
    """A path the launch opens: within PATH_MAX, each component within NAME_MAX."""
    if not text:
        raise ValueError("must not be empty")
    if (size := _utf8_size(text)) > MAX_PATH_BYTES:
        raise ValueError(f"is {size:,} bytes; a path may have at most {MAX_PATH_BYTES:,}")
    for part in text.split("/"):
        if (size := _utf8_size(part)) > MAX_PATH_COMPONENT_BYTES:
            raise ValueError(
                f"has a component of {size:,} bytes ({part[:40]!r}...); each may have at most "
                f"{MAX_PATH_COMPONENT_BYTES}"
            )
    return text


def image_reference(text: str) -> str:
    """``[registry[:port]/]name[:tag][@digest]``, as a container runtime would pull it."""
    match = _IMAGE.fullmatch(text)
    if match is None:
        raise ValueError(
            "is not an image reference ([registry[:port]/]name[:tag][@sha256:digest], "
            "the name in lowercase)"
        )
    if len(match["name"]) > MAX_IMAGE_NAME:
        raise ValueError(f"has a name longer than {MAX_IMAGE_NAME} characters")
    return text


def env_name(name: str) -> str:
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(
            f"env.{name}: zeropilot sets this variable in every rank (reserved: "
            f"{', '.join(sorted(RESERVED_ENV_NAMES))} and names starting with "
            f"{' or '.join(RESERVED_ENV_PREFIXES)}); choose another name"
        )
    return name


def env_size(env: dict[str, str]) -> dict[str, str]:
    total = sum(_utf8_size(name) + _utf8_size(value) + 2 for name, value in env.items())
    if total > MAX_ENV_BYTES:
        raise ValueError(
            f"holds {total:,} bytes in all; at most {MAX_ENV_BYTES:,} bytes are allowed"
        )
    return env


def args_size(args: list[str]) -> list[str]:
    total = sum(_utf8_size(arg) + 1 for arg in args)
    if total > MAX_ARGS_BYTES:
        raise ValueError(
            f"hold {total:,} bytes in all; at most {MAX_ARGS_BYTES:,} bytes are allowed"
        )
    return args


EnvName = Annotated[
    str,
    Field(pattern=ENV_NAME_PATTERN, max_length=MAX_ENV_NAME),
    AfterValidator(env_name),
]
EnvValue = Annotated[str, AfterValidator(plain_text), at_most_bytes(MAX_ENV_VALUE_BYTES)]
Environment = Annotated[
    dict[EnvName, EnvValue], Field(max_length=MAX_ENV_VARIABLES), AfterValidator(env_size)
]
Argument = Annotated[str, AfterValidator(plain_text), at_most_bytes(MAX_ARG_BYTES)]
Arguments = Annotated[list[Argument], Field(max_length=MAX_ARGS), AfterValidator(args_size)]
FilePath = Annotated[str, AfterValidator(no_control_characters), AfterValidator(file_path)]
ImageReference = Annotated[
    str, Field(max_length=MAX_PATH_BYTES), AfterValidator(no_control_characters),
    AfterValidator(image_reference),
]  # fmt: skip
