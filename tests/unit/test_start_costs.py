"""What the processes started per command or per attempt import: the CLI and the local
supervisor start without pydantic (it was a third of the CLI's start and most of the
supervisor's), and every cluster kind still finds its backend module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.core.clusters import BackendKind
from workers.backends import get_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["zeropilot.cli", "workers.backends.local_supervisor"])
def test_started_without_pydantic(module: str) -> None:
    probe = f"import sys, {module}; print(sorted(m for m in sys.modules if 'pydantic' in m))"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == "[]"


def test_every_cluster_kind_has_its_backend() -> None:
    assert [get_backend(kind).__name__ for kind in BackendKind] == [
        f"workers.backends.{kind.value}" for kind in BackendKind
    ]
    with pytest.raises(ValueError, match="no backend for cluster kind 'mainframe'"):
        get_backend("mainframe")
