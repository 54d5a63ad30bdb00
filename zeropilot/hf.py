"""Hugging Face Trainer jobs under zeropilot: one callback and the Trainer's arguments.

A Trainer script needs two lines of zeropilot: ``args = training_arguments(**yours)`` and
``callbacks=[ZeropilotCallback()]``. The arguments come from this attempt's plan (the ds_config
zeropilot rendered), so a re-planned attempt (new micro-batch, checkpointing on) never disagrees
with the script, and the callback reports what ``zeropilot.runtime`` reports for a hand-written
loop. transformers is imported only when these are used.

The rendered ds_config holds no ``"auto"`` value: batch sizes, accumulation, clipping, the
optimizer and its learning rate, precision and every ZeRO knob are concrete numbers. The Trainer
checks each concrete value against its own arguments and refuses a mismatch; the arguments this
module returns are taken from the same config, so they agree. With no ``scheduler`` block in the
config the Trainer's own schedule (``lr_scheduler_type``, warm-up) drives DeepSpeed's optimizer.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from zeropilot.resume import ResumeMethod
from zeropilot.runtime import (
    STOPPED_EXIT_CODE,
    Reporter,
    ResumePoint,
    checkpoint_dir,
    resume_point,
)

# Values zeropilot owns; a user value that differs is refused, an equal one is accepted.
PLANNED = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "fp16",
    "activation_checkpointing",
    "gradient_checkpointing",
    "deepspeed",
    "output_dir",
    "max_grad_norm",
    "learning_rate",
    "resume_from_checkpoint",
)
# Retention is zeropilot's (checkpoint.keep_last); the Trainer's rotation could delete the one
# an attempt resumes from.
_ALIASES = {
    "gradient_checkpointing": "activation_checkpointing",
    "activation_checkpointing": "gradient_checkpointing",
}
REFUSED = {"save_total_limit": "checkpoint.keep_last and keep_every_steps in the job spec"}


@dataclass(frozen=True)
class Plan:
    """What this attempt's plan fixes for the Trainer, read from its ds_config."""

    ds_config_path: str
    values: dict[str, Any]  # TrainingArguments field -> the plan's value
    sources: dict[str, str]  # TrainingArguments field -> where in the plan it comes from


def plan_from_env(checkpointing: str = "activation_checkpointing") -> Plan | None:
    """This attempt's plan, or None outside zeropilot (no ``ZEROPILOT_DS_CONFIG``)."""
    path = os.environ.get("ZEROPILOT_DS_CONFIG")
    if not path:
        return None
    with open(path) as source:
        config = json.load(source)
    return plan_of(path, config, os.environ, checkpointing)


def plan_of(
    path: str, config: dict[str, Any], env: Any, checkpointing: str = "activation_checkpointing"
) -> Plan:
    """The Trainer's values for a ds_config and the attempt's environment; ``checkpointing``
    names the Trainer's field for it (``gradient_checkpointing`` before transformers 5.x's
    ``activation_checkpointing``)."""
    values: dict[str, Any] = {
        "per_device_train_batch_size": config["train_micro_batch_size_per_gpu"],
        "gradient_accumulation_steps": config["gradient_accumulation_steps"],
        "bf16": bool(config.get("bf16", {}).get("enabled", False)),
        "fp16": bool(config.get("fp16", {}).get("enabled", False)),
        checkpointing: env.get("ZEROPILOT_ACTIVATION_CHECKPOINTING") == "1",
        "deepspeed": path,
        "output_dir": checkpoint_dir(),
        "max_grad_norm": float(config.get("gradient_clipping", 0.0)),
    }
    sources = {
        "per_device_train_batch_size": "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps": "gradient_accumulation_steps",
        "bf16": "bf16.enabled",
        "fp16": "fp16.enabled",
        checkpointing: "ZEROPILOT_ACTIVATION_CHECKPOINTING",
        "deepspeed": "ZEROPILOT_DS_CONFIG",
        "output_dir": "ZEROPILOT_CHECKPOINT_DIR",
        "max_grad_norm": "gradient_clipping",
    }
    lr = config.get("optimizer", {}).get("params", {}).get("lr")
    if lr is not None:
        values["learning_rate"], sources["learning_rate"] = float(lr), "optimizer.params.lr"
    native = env.get("ZEROPILOT_RESUME_METHOD") == ResumeMethod.NATIVE
    if env.get("ZEROPILOT_RESUME_FROM") and native:
        values["resume_from_checkpoint"] = env["ZEROPILOT_RESUME_FROM"]
        sources["resume_from_checkpoint"] = "ZEROPILOT_RESUME_FROM"
    return Plan(path, values, sources)


def merged_arguments(plan: Plan | None, yours: dict[str, Any]) -> dict[str, Any]:
    """Your arguments with the plan's; ValueError naming both where they disagree."""
    for name, instead in REFUSED.items():
        if yours.get(name) is not None:
            raise ValueError(f"{name}={yours[name]!r}: zeropilot keeps checkpoints by {instead}")
    if plan is None:
        return dict(yours)
    for name, value in yours.items():
        planned = name if name in plan.values else _ALIASES.get(name)
        if planned in plan.values and not _same(value, plan.values[planned]):
            raise ValueError(
                f"training_arguments({name}={value!r}) contradicts this attempt's plan: "
                f"{plan.sources[planned]} = {plan.values[planned]!r} (from "
                f"{plan.ds_config_path}); leave {name} out and zeropilot sets it"
            )
    yours = {k: v for k, v in yours.items() if _ALIASES.get(k) not in plan.values}
    interval = os.environ.get("ZEROPILOT_CHECKPOINT_INTERVAL")
    defaults: dict[str, Any] = (
        {"save_strategy": "steps", "save_steps": int(interval)} if (interval) else {}
    )
    defaults["include_num_input_tokens_seen"] = True  # tokens/s in the metrics
    return {**defaults, **yours, **plan.values}


def _same(yours: Any, planned: Any) -> bool:
    if isinstance(planned, float) and isinstance(yours, int | float):
        return math.isclose(float(yours), planned, rel_tol=1e-9)
    if isinstance(planned, str) and isinstance(yours, str | os.PathLike):
        return os.path.normpath(os.fspath(yours)) == os.path.normpath(planned)
    return bool(yours == planned)


def training_arguments(**yours: Any) -> Any:
    """``transformers.TrainingArguments`` for this attempt: your values plus the plan's
    micro-batch, accumulation, precision, gradient checkpointing, ds_config, output folder,
    clipping, learning rate and (on a native resume) ``resume_from_checkpoint``; pass
    ``args.resume_from_checkpoint`` to ``trainer.train``. Outside zeropilot: yours alone."""
    import dataclasses

    import torch
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    field = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else ("gradient_checkpointing")
    )
    plan = plan_from_env(field)
    merged = merged_arguments(plan, yours)
    if not torch.cuda.is_available():  # else accelerate sees one process, and refuses bf16
        merged.setdefault("use_cpu", True)
    return TrainingArguments(**merged)


def _memory_peak_bytes() -> int:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        return int(cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class CallbackLogic:
    """What ZeropilotCallback does at each Trainer event; kept free of transformers so that it
    can be read (and tested) alone."""

    def __init__(self, reporter: Reporter | None = None) -> None:
        self.reporter = reporter or Reporter.from_env()
        self.resume: ResumePoint | None = resume_point()
        self._last_log: tuple[float, int] | None = None  # (time, tokens seen)
        self._save_began: float | None = None
        self._stopping = False
        self._hooked = False
        self._counted_from = 0  # a weights resume's first step, until its first log
        self.reporter.watch_for_stop()  # from the start: a stop before the first step saves too

    # --- start ---------------------------------------------------------------------------
    def init_end(self, model: Any) -> None:
        self._hook_exceptions()
        resume = self.resume
        if resume is not None and resume.method != ResumeMethod.NATIVE and model is not None:
            load_weights_into(model, resume)  # before the Trainer builds the engine

    def train_begin(self, state: Any) -> None:
        self.reporter.device_memory()
        if self.resume is not None and self.resume.method != ResumeMethod.NATIVE:
            state.global_step = _step_of(self.resume)  # the weights' step: count on from it
            self._counted_from = state.global_step
        self._last_log = (time.perf_counter(), int(getattr(state, "num_input_tokens_seen", 0)))

    # --- each step -------------------------------------------------------------------------
    def step_end(self, state: Any, control: Any, args: Any = None) -> None:
        self._save_began = time.perf_counter()
        if args is not None and follows_zeropilots_interval(args) and not _last(state):
            # the interval as it is now (auto moves it), not the Trainer's fixed save_steps
            control.should_save = self.reporter.checkpoint_due(state.global_step)
        if state.global_step < state.max_steps and self.reporter.stop_requested():
            control.should_save = True  # every rank asked the same all-reduce: the same step
            control.should_training_stop = True
            self._stopping = True

    def log(self, state: Any, logs: dict[str, Any] | None) -> None:
        self._save_began = time.perf_counter()  # a save after this log starts now
        if logs and "loss" in logs and self._counted_from:
            _rescale_first_loss(state, logs, self._counted_from)
            self._counted_from = 0
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        extra = {k: float(logs[k]) for k in ("learning_rate", "grad_norm") if k in logs}
        self.reporter.metrics(
            state.global_step,
            loss=float(logs["loss"]),
            tokens_per_s=self._tokens_per_s(state),
            memory_peak_bytes=_memory_peak_bytes(),
            **extra,
        )

    def evaluate(self) -> None:
        self._save_began = time.perf_counter()

    def save(self, args: Any, state: Any) -> None:
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        seconds = time.perf_counter() - self._save_began if self._save_began else None
        if state.is_world_process_zero:
            self.reporter.checkpoint(state.global_step, path, seconds=seconds)
        if self._stopping:
            if state.is_world_process_zero:
                self.reporter.stopped(state.global_step, path)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(STOPPED_EXIT_CODE)  # saved on every rank; no teardown to abort in

    def _tokens_per_s(self, state: Any) -> float | None:
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        now = time.perf_counter()
        before, self._last_log = self._last_log, (now, seen)
        if before is None or seen <= before[1] or now <= before[0]:
            return None  # the Trainer counts tokens only with include_num_input_tokens_seen
        return (seen - before[1]) / (now - before[0])

    # --- failure ---------------------------------------------------------------------------
    def _hook_exceptions(self) -> None:
        """An exception out of ``trainer.train`` ends the process: report an OOM first."""
        if self._hooked:
            return
        self._hooked = True
        previous = sys.excepthook

        def report_then_raise(
            kind: type[BaseException], exc: BaseException, trace: TracebackType | None
        ) -> None:
            self.reporter.report_oom(exc)
            previous(kind, exc, trace)

        sys.excepthook = report_then_raise


def follows_zeropilots_interval(args: Any) -> bool:
    """Whether the Trainer saves every ``save_steps`` that zeropilot gave it (not yours): then
    the callback follows zeropilot's interval as it changes. The same answer on every rank."""
    given = os.environ.get("ZEROPILOT_CHECKPOINT_INTERVAL", "")
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    return given.isdigit() and strategy == "steps" and args.save_steps == int(given)


def _last(state: Any) -> bool:
    return bool(state.global_step >= state.max_steps)  # the Trainer's own final save stands


def _rescale_first_loss(state: Any, logs: dict[str, Any], counted_from: int) -> None:
    """The Trainer divides the first logged loss by the steps since step 0, not since the step
    a weights resume counts on from (it set its log mark before on_train_begin): undo that."""
    steps = state.global_step - counted_from
    if steps <= 0:
        return
    logs["loss"] = float(logs["loss"]) * state.global_step / steps
    history = state.log_history[-1] if state.log_history else {}
    if history.get("step") == state.global_step and "loss" in history:
        history["loss"] = logs["loss"]


def _step_of(point: ResumePoint) -> int:
    """The step of a Trainer checkpoint (``checkpoint-N``) or a DeepSpeed tag (``global_stepN``)."""
    name = os.path.basename(point.tag.rstrip("/"))
    for prefix in ("checkpoint-", "global_step"):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return int(name[len(prefix) :])
    raise ValueError(f"no step in the checkpoint name {name!r}")


def deepspeed_tag_of(folder: str) -> str:
    """The DeepSpeed tag inside a Trainer checkpoint: what its ``latest`` file names."""
    with open(os.path.join(folder, "latest")) as latest:
        return latest.read().strip()


def load_weights_into(model: Any, point: ResumePoint) -> None:
    """The checkpoint's consolidated weights into ``model`` before the engine exists (the
    ``weights`` method; ``universal`` too: the Trainer loads no universal checkpoint). Under
    ZeRO-3 the model may be partitioned already (zero.Init): gather, load on rank 0, scatter."""
    import deepspeed

    from zeropilot.resume_weights import load_weights

    folder = os.path.join(point.load_dir, point.tag)
    inner = ResumePoint(folder, deepspeed_tag_of(folder), ResumeMethod.WEIGHTS)
    partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
    if not partitioned:
        load_weights(model, inner)
        return
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        if _rank() == 0:
            load_weights(model, inner)


def _callback_class() -> type:
    """The TrainerCallback subclass, built on first use so that importing this module is cheap."""
    from transformers import TrainerCallback

    class ZeropilotCallback(TrainerCallback):
        """Reports metrics, checkpoints, device memory and OOMs to zeropilot, and turns a stop
        request (SIGTERM) into a save and a stop at the same step on every rank."""

        def __init__(self, reporter: Reporter | None = None) -> None:
            self.logic = CallbackLogic(reporter)

        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.logic.init_end(kwargs.get("model"))

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.logic.train_begin(state)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.logic.step_end(state, control, args)

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.logic.log(state, kwargs.get("logs"))

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.logic.evaluate()

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.logic.save(args, state)

    return ZeropilotCallback


_classes: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``ZeropilotCallback``: a real ``transformers.TrainerCallback`` subclass, made when first
    imported (``from zeropilot.hf import ZeropilotCallback``)."""
    if name != "ZeropilotCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _classes:
        _classes[name] = _callback_class()
    return _classes[name]
