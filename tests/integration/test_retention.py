"""Checkpoint retention on real DeepSpeed and Trainer checkpoints, through the worker's pass.

The checkpoints are written by real training (the Trainer example and train_tiny, on the CPU)
into the job's own folder and reported through the runtime API as the training code reports
them; then the worker's retention pass runs (``workers.retention.retain``, what the reconcile
calls after a new report). Hostile or broken things are made for real: a rank SIGKILLed halfway
through its save, a checkpoint swapped for a link to another folder, a link inside one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.core.clusters import LOCAL_PROFILE
from service.db.attempts import resume_checkpoint
from service.db.models import Job
from service.db.session import get_engine
from service.settings import Settings
from tests.e2e.stack import free_port
from tests.integration.helpers import REPO, auth, tiny_spec
from tests.integration.test_isolation import report, set_attempt
from workers.backends import local
from workers.backends.base import BackendState, LaunchRequest
from workers.retention import retain

pytestmark = pytest.mark.slow

HF = REPO / "examples" / "hf-trainer"


def submit(client: TestClient, token: str, gpus: int, **changes: Any) -> dict[str, Any]:
    spec = tiny_spec(resources={"cluster": "local", "nodes": 1, "gpus_per_node": gpus}, **changes)
    answer = client.post("/v1/jobs", json=spec, headers=auth(token))
    assert answer.status_code == 201, answer.text
    job: dict[str, Any] = answer.json()
    return job


def one_rank(script: Path, args: list[str], ds_config: dict[str, Any], folder: Path) -> None:
    """Run a training script as one DeepSpeed rank saving into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder.parent / "ds_config.json"
    config.write_text(json.dumps(ds_config))
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "ZEROPILOT_DS_CONFIG": str(config),
        "ZEROPILOT_CHECKPOINT_DIR": str(folder),
    }
    argv = [sys.executable, str(script), *args, "--deepspeed_config", str(config)]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=600, cwd=script.parent
    )
    assert done.returncode == 0, done.stderr[-4000:]


def detail(client: TestClient, token: str, job_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    return answer


def bytes_below(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def test_ten_trainer_saves_keep_the_last_two_every_fifth_and_the_resumed_one(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    job = submit(
        client,
        tokens["alice"],
        gpus=1,
        zero={"stage": 2},
        checkpoint={"keep_last": 2, "keep_every_steps": 5},
    )
    attempt = job["attempts"][0]
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    one_rank(
        HF / "train.py",
        ["--max-steps", "10", "--save-steps", "1"],
        attempt["plan"]["ds_config"],
        folder,
    )
    for step in range(1, 11):
        path = folder / f"checkpoint-{step}"
        assert report(client, settings, attempt["id"], str(path), step).status_code == 204
    set_attempt(settings, attempt["id"], resumed_from=str(folder / "checkpoint-3"))

    deleted = retain(settings, job["id"])

    remaining = sorted(int(p.name.split("-")[1]) for p in folder.iterdir())
    assert remaining == [3, 5, 9, 10]  # resumed from; every 5th; the last two
    assert sorted(deleted) == sorted(str(folder / f"checkpoint-{s}") for s in (1, 2, 4, 6, 7, 8))
    shown = detail(client, tokens["alice"], job["id"])
    events = [e for e in shown["events"] if e["subject"] == "storage"]
    assert len(events) == 6 and all(e["to_status"] == "DELETED" for e in events)
    assert events[0]["reason"].startswith(f"deleted the step-1 checkpoint {folder}/checkpoint-1 (")
    assert events[0]["reason"].endswith(" MiB): not kept by keep_last 2, keep_every_steps 5")
    assert shown["checkpoint_bytes"] == bytes_below(folder)
    kept = [c for c in shown["checkpoints"] if c["deleted_at"] is None]
    assert [c["step"] for c in kept] == [3, 5, 9, 10] and all(c["complete"] for c in kept)
    assert retain(settings, job["id"]) == []  # nothing new: nothing more to delete


def test_ten_deepspeed_saves_keep_the_last_two(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    job = submit(client, tokens["alice"], gpus=1, zero={"stage": 1})
    attempt = job["attempts"][0]
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    args = ["--steps", "10", "--checkpoint-interval", "1"]
    one_rank(REPO / "examples" / "train_tiny.py", args, attempt["plan"]["ds_config"], folder)
    for step in range(1, 11):
        path = folder / f"global_step{step}"
        assert report(client, settings, attempt["id"], str(path), step).status_code == 204

    retain(settings, job["id"])

    assert sorted(p.name for p in folder.glob("global_step*")) == ["global_step10", "global_step9"]
    assert (folder / "latest").read_text() == "global_step10"


def run_two_ranks(folder: Path, ds_config: dict[str, Any], steps: int, **env: str) -> BackendState:
    """train_tiny on 2 CPU ranks through the local backend, as a launch would."""
    folder.mkdir(parents=True)
    (folder / "ds_config.json").write_text(json.dumps(ds_config))
    ref = local.submit(
        LaunchRequest(
            name=f"zp-retention-{folder.name}",
            attempt_dir=folder,
            nodes=1,
            procs_per_node=2,
            entrypoint="train_tiny.py",
            args=("--steps", str(steps), "--checkpoint-interval", "2"),
            ds_config_path=folder / "ds_config.json",
            env=env,
            working_dir=REPO / "examples",
            profile=LOCAL_PROFILE,
            python=sys.executable,
        )
    )
    deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
    while not (status := local.poll(LOCAL_PROFILE, ref)).state.terminal:
        assert time.monotonic() < deadline, local.logs(LOCAL_PROFILE, ref)
        time.sleep(0.5)
    return status.state


def test_a_rank_killed_mid_save_leaves_a_checkpoint_never_latest_nor_resumed_from(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    job = submit(client, tokens["alice"], gpus=2, zero={"stage": 1}, checkpoint={"keep_last": 1})
    attempt = job["attempts"][0]
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    ended = run_two_ranks(
        settings.attempts_dir / "killed",
        attempt["plan"]["ds_config"],
        steps=4,
        ZEROPILOT_CHECKPOINT_DIR=str(folder),
        TINY_DIE_MID_SAVE_AT_STEP="4",
    )
    assert ended == BackendState.FAILED
    # DeepSpeed's own `latest` names the step-4 save, though rank 1's file is half written.
    assert (folder / "latest").read_text() == "global_step4"
    cut = folder / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    whole = folder / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    assert 0 < cut.stat().st_size < whole.stat().st_size
    for step in (2, 4):  # as if the training code had reported both
        assert (
            report(
                client, settings, attempt["id"], str(folder / f"global_step{step}"), step
            ).status_code
            == 204
        )

    retain(settings, job["id"])

    assert (folder / "global_step2").is_dir()  # the newest complete, though keep_last is 1
    assert (folder / "global_step4").is_dir()  # newer and incomplete: not deleted, not counted
    shown = {c["step"]: c for c in detail(client, tokens["alice"], job["id"])["checkpoints"]}
    assert (shown[2]["complete"], shown[4]["complete"]) == (True, False)
    with Session(get_engine(settings.database_url)) as session:
        chosen = resume_checkpoint(session, settings.data_dir, session.get(Job, job["id"]))
    assert chosen is not None and chosen.step == 2  # what escalate and disruption resume from


def torch_file(path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"module": {}}, path)


def test_retention_follows_no_link_out_of_the_jobs_folder(
    client: TestClient, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    job = submit(client, tokens["alice"], gpus=1, zero={"stage": 0}, checkpoint={"keep_last": 1})
    attempt = job["attempts"][0]
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    outside = tmp_path / "not-the-jobs"
    torch_file(outside / "global_step1" / "mp_rank_00_model_states.pt")
    (outside / "precious.txt").write_text("another team's data\n")
    for step in (1, 2, 3):
        torch_file(folder / f"global_step{step}" / "mp_rank_00_model_states.pt")
        assert (
            report(
                client, settings, attempt["id"], str(folder / f"global_step{step}"), step
            ).status_code
            == 204
        )
    # After the reports, the job swaps step 1 for a link out and puts a link inside step 2.
    shutil.rmtree(folder / "global_step1")
    (folder / "global_step1").symlink_to(outside / "global_step1", target_is_directory=True)
    (folder / "global_step2" / "escape").symlink_to(outside, target_is_directory=True)

    deleted = retain(settings, job["id"])

    assert deleted == [str(folder / "global_step2")]  # its link removed, not what it points to
    assert (outside / "precious.txt").read_text() == "another team's data\n"
    assert (outside / "global_step1" / "mp_rank_00_model_states.pt").is_file()
    assert (folder / "global_step1").is_symlink()  # not followed, not deleted
    shown = {c["step"]: c for c in detail(client, tokens["alice"], job["id"])["checkpoints"]}
    assert shown[1]["complete"] is False and shown[1]["deleted_at"] is None
    assert (
        shown[3]["size_bytes"]
        == (folder / "global_step3" / "mp_rank_00_model_states.pt").stat().st_size
    )
