"""zeropilot.hf: the Trainer's arguments come from the plan; contradictions are refused."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

import pytest

from zeropilot.hf import CallbackLogic, follows_zeropilots_interval, merged_arguments, plan_of
from zeropilot.runtime import Reporter

CONFIG: dict[str, Any] = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "adam_w_mode": True}},
}
ENV = {"ZEROPILOT_ACTIVATION_CHECKPOINTING": "1"}


@pytest.fixture(autouse=True)
def _attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROPILOT_CHECKPOINT_DIR", "/data/jobs/j1/checkpoints")
    monkeypatch.setenv("ZEROPILOT_CHECKPOINT_INTERVAL", "50")


def test_the_plan_sets_batch_precision_checkpointing_config_and_folder() -> None:
    args = merged_arguments(plan_of("/a/ds_config.json", CONFIG, ENV), {"max_steps": 100})
    assert args["per_device_train_batch_size"] == 4
    assert args["gradient_accumulation_steps"] == 2
    assert (args["bf16"], args["fp16"]) == (True, False)
    assert args["activation_checkpointing"] is True
    assert args["deepspeed"] == "/a/ds_config.json"
    assert args["output_dir"] == "/data/jobs/j1/checkpoints"
    assert (args["max_grad_norm"], args["learning_rate"]) == (1.0, 0.003)
    assert (args["save_strategy"], args["save_steps"]) == ("steps", 50)  # the spec's interval
    assert args["max_steps"] == 100
    assert "resume_from_checkpoint" not in args


def test_a_user_value_that_contradicts_the_plan_is_refused_naming_both() -> None:
    plan = plan_of("/a/ds_config.json", CONFIG, ENV)
    with pytest.raises(ValueError) as refused:
        merged_arguments(plan, {"per_device_train_batch_size": 8})
    message = str(refused.value)
    assert "per_device_train_batch_size=8" in message
    assert "train_micro_batch_size_per_gpu = 4" in message and "/a/ds_config.json" in message
    with pytest.raises(ValueError, match=r"fp16=True.*fp16.enabled = False"):
        merged_arguments(plan, {"fp16": True})
    with pytest.raises(ValueError, match=r"gradient_checkpointing=False.*CHECKPOINTING = True"):
        merged_arguments(plan, {"gradient_checkpointing": False})  # the older name, too
    with pytest.raises(ValueError, match=r"output_dir='/tmp/out'.*ZEROPILOT_CHECKPOINT_DIR"):
        merged_arguments(plan, {"output_dir": "/tmp/out"})


def test_a_user_value_equal_to_the_plan_and_your_own_save_steps_are_kept() -> None:
    plan = plan_of("/a/ds_config.json", CONFIG, ENV)
    args = merged_arguments(
        plan, {"gradient_accumulation_steps": 2, "learning_rate": 3e-3, "save_steps": 7}
    )
    assert (args["gradient_accumulation_steps"], args["save_steps"]) == (2, 7)


def test_the_trainers_own_rotation_is_refused() -> None:
    with pytest.raises(ValueError, match=r"checkpoint\.keep_last"):
        merged_arguments(plan_of("/a/ds_config.json", CONFIG, ENV), {"save_total_limit": 2})


def test_a_native_resume_sets_resume_from_checkpoint_and_a_weights_one_does_not() -> None:
    native = {
        **ENV,
        "ZEROPILOT_RESUME_FROM": "/c/checkpoint-4",
        "ZEROPILOT_RESUME_METHOD": "native",
    }
    assert plan_of("/a/d.json", CONFIG, native).values["resume_from_checkpoint"] == (
        "/c/checkpoint-4"
    )
    weights = {**native, "ZEROPILOT_RESUME_METHOD": "weights"}
    assert "resume_from_checkpoint" not in plan_of("/a/d.json", CONFIG, weights).values


def test_outside_zeropilot_your_arguments_pass_unchanged() -> None:
    assert merged_arguments(None, {"output_dir": "out", "max_steps": 3}) == {
        "output_dir": "out",
        "max_steps": 3,
    }


def test_importing_the_module_does_not_import_transformers() -> None:
    import subprocess
    import sys

    code = "import sys, zeropilot.hf; print('transformers' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_callback_saves_at_zeropilots_interval_as_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the Trainer saving every save_steps zeropilot gave it, the callback decides each
    step from the interval the runtime heard last (auto moves it); the final save stands."""
    signal_handler = signal.getsignal(signal.SIGTERM)
    logic = CallbackLogic(Reporter(checkpoint_interval=50))  # outside a world: rank 0 alone
    signal.signal(signal.SIGTERM, signal_handler)  # it watched for stops; the test does not
    args = SimpleNamespace(save_strategy="steps", save_steps=50)
    saved = []
    for step in range(1, 101):
        if step == 31:
            logic.reporter.checkpoint_interval = 20  # a metrics report's answer moved it
        state, control = SimpleNamespace(global_step=step, max_steps=100), SimpleNamespace()
        control.should_save = step % 50 == 0  # the Trainer's own rule, before the callback
        logic.step_end(state, control, args)
        if control.should_save:
            logic.reporter.checkpoint(step, f"/c/{step}")
            saved.append(step)
    # At step 31 the new interval has passed since the start: a save at once, then every 20
    # (not at 50, the Trainer's own); the final step's save stands.
    assert saved == [31, 51, 71, 91, 100]
    mine = SimpleNamespace(save_strategy="steps", save_steps=7)  # your own save_steps
    assert not follows_zeropilots_interval(mine) and follows_zeropilots_interval(args)
