"""A job that swaps its own log for a link to the service's files, through real processes.

The API (uvicorn), a Celery worker and the local backend run as an operator runs them; the
job's script does what the issue's attacker did, from inside the attempt, then exits 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow

SWAP_LOG = """
import os, pathlib
folder = pathlib.Path(os.environ["ZEROPILOT_DS_CONFIG"]).parent  # the attempt's own folder
print("about to swap", flush=True)
if os.environ.get("RANK", "0") == "0":
    (folder / "swap").symlink_to(os.environ["TARGET"])
    os.replace(folder / "swap", folder / "node-0.log")
"""


def test_the_api_does_not_serve_a_file_the_job_linked_its_log_to(
    stack: Stack, api: Api, tmp_path: Path
) -> None:
    private = tmp_path / "private.key"
    private.write_text("the service's signing key\n")
    private.chmod(0o600)
    (tmp_path / "swap_log.py").write_text(SWAP_LOG)
    stack.start_worker("w1")
    spec = tiny_spec("swapper", entrypoint="swap_log.py", working_dir=str(tmp_path))
    job = api.submit({**spec, "args": [], "env": {"TARGET": str(private)}})
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)

    tail = api.http.get(f"/v1/jobs/{job['id']}/logs")
    follow = api.http.get(f"/v1/jobs/{job['id']}/logs", params={"offset": 0})

    assert done["status"] == "SUCCEEDED", done["message"]
    for answer in (tail, follow):
        assert answer.status_code == 409, answer.text
        assert "node-0.log is a symbolic link; zeropilot does not follow it" in answer.text
        assert "signing key" not in answer.text
