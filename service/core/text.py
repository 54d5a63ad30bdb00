"""The pydantic type of a bounded, NUL-free text field (``service.core.limits`` stays free of
pydantic: the CLI imports it, and pydantic alone was a third of the CLI's start)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from service.core.limits import MAX_TEXT, no_nul

# Text that reaches a file, a process's arguments or environment, or PostgreSQL.
Text = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(no_nul)]
