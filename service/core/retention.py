"""Which of a job's checkpoints to keep: a pure decision over what the worker found on disk.

The worker lists each reported checkpoint (without following links), decides here whether it is
complete, then asks which to delete. Kept, whatever the policy says: the newest complete
checkpoint (the next attempt resumes from it), every checkpoint an attempt resumed from, and
incomplete ones newer than it (a save may still be committing). Then ``keep_last`` complete
ones, one every ``keep_every_steps`` steps, and the best by ``keep_best``. The rest go, an
older incomplete one included (nothing can resume from it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

TRAINER_STATE = "trainer_state.json"  # the Trainer writes it after every rank's save
DEEPSPEED_LATEST = "latest"  # names the tag; rank 0 writes it before the final barrier


@dataclass(frozen=True)
class Retention:
    keep_last: int = 2
    keep_every_steps: int | None = None
    best_metric: str | None = None
    best_mode: Literal["min", "max"] = "min"


@dataclass(frozen=True)
class Saved:
    """One reported checkpoint as the worker found it."""

    id: int
    step: int
    path: str
    complete: bool
    metric: float | None = None  # the keep_best metric at its step, where reported


def missing_deepspeed_files(names: Iterable[str], stage: int, world_size: int) -> list[str]:
    """The files a DeepSpeed tag folder lacks for a save of every rank at ``stage`` (data
    parallel only: one model-parallel rank). ``latest`` cannot tell: rank 0 writes it first."""
    present = set(names)
    wanted = ["mp_rank_00_model_states.pt"] if stage < 3 else []
    for rank in range(world_size if stage > 0 else 0):
        if stage == 3:
            wanted.append(f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
        wanted.append(f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    # bf16 runs prefix the optimizer files ("bf16_zero_pp_rank_0_...")
    return [w for w in wanted if w not in present and f"bf16_{w}" not in present]


def is_trainer_checkpoint(names: Iterable[str]) -> bool:
    return TRAINER_STATE in set(names)


def to_delete(
    saved: Sequence[Saved], policy: Retention, resumed_from: Iterable[str]
) -> dict[int, str]:
    """The ids to delete, each with why the policy no longer keeps it."""
    kept = kept_ids(saved, policy, resumed_from)
    newest = _newest_complete_step(saved)
    doomed: dict[int, str] = {}
    for checkpoint in saved:
        if checkpoint.id in kept:
            continue
        if not checkpoint.complete:
            doomed[checkpoint.id] = f"incomplete, older than the newest complete (step {newest})"
        else:
            doomed[checkpoint.id] = _why_not_kept(policy)
    return doomed


def kept_ids(saved: Sequence[Saved], policy: Retention, resumed_from: Iterable[str]) -> set[int]:
    pinned = set(resumed_from)
    complete = sorted((c for c in saved if c.complete), key=lambda c: (c.step, c.id))
    newest = complete[-1].step if complete else None
    kept = {c.id for c in saved if c.path in pinned}
    kept |= {c.id for c in complete[-policy.keep_last :]}  # the newest complete is among them
    kept |= {c.id for c in saved if not c.complete and (newest is None or c.step > newest)}
    if policy.keep_every_steps:
        kept |= {c.id for c in complete if c.step % policy.keep_every_steps == 0}
    best = _best(complete, policy)
    if best is not None:
        kept.add(best.id)
    return kept


def _best(complete: Sequence[Saved], policy: Retention) -> Saved | None:
    scored = [c for c in complete if c.metric is not None]
    if policy.best_metric is None or not scored:
        return None
    sign = 1.0 if policy.best_mode == "min" else -1.0
    return min(scored, key=lambda c: (sign * (c.metric or 0.0), -c.step))


def _newest_complete_step(saved: Sequence[Saved]) -> int | None:
    steps = [c.step for c in saved if c.complete]
    return max(steps) if steps else None


def _why_not_kept(policy: Retention) -> str:
    rules = [f"keep_last {policy.keep_last}"]
    if policy.keep_every_steps:
        rules.append(f"keep_every_steps {policy.keep_every_steps}")
    if policy.best_metric:
        rules.append(f"keep_best {policy.best_metric} ({policy.best_mode})")
    return "not kept by " + ", ".join(rules)


def metric_at(values: Mapping[str, float | None], name: str) -> float | None:
    """A metric point's value of ``name``: ``loss``, ``tokens_per_s`` or an extra."""
    value = values.get(name)
    return float(value) if value is not None else None
