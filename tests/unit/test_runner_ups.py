"""Why the plan won, option by option (``zeropilot advise --explain``): Llama-7B on eight
H100-80GB, where ZeRO-0 and the larger micro-batches do not fit, ZeRO-1 ties ZeRO-2, and the
rest are slower."""

from __future__ import annotations

from service.core.advisor import advise
from service.core.advisor.runner_ups import rivals
from tests.unit.test_advisor import H100_NODE, llama7b
from zeropilot.advice_explain import budgets_of


def by_label(typical_error: float = 0.0) -> dict[str, tuple[str, str]]:
    advice = advise(llama7b(), H100_NODE)
    listed = rivals(advice, budgets_of(H100_NODE), typical_error)
    assert listed[0].candidate == advice.plan and listed[0].outcome == "chosen"
    return {r.candidate.label(): (r.outcome, r.why) for r in listed}


def test_the_plan_comes_first_then_every_other_family_and_micro_batch_once() -> None:
    advice = advise(llama7b(), H100_NODE)
    listed = rivals(advice, budgets_of(H100_NODE))
    labels = [r.candidate.label() for r in listed]
    assert labels[0] == "ZeRO-2 mb=2x16"
    assert len(labels) == len(set(labels))
    families = {(c.zero_stage, c.offload_optimizer, c.offload_param, c.activation_checkpointing)
                for c in advice.candidates}  # fmt: skip
    micro = {c.micro_batch_size for c in advice.candidates if c.zero_stage == 2
             and c.offload_optimizer == "none" and not c.activation_checkpointing}  # fmt: skip
    assert len(labels) == len(families) + len(micro) - 1  # the plan is one of each


def test_each_option_says_why_it_lost() -> None:
    shown = by_label()
    assert shown["ZeRO-2 mb=2x16"] == (
        "chosen", "chosen: the least time per sample of those that fit",
    )  # fmt: skip
    assert shown["ZeRO-0 mb=2x16"] == (
        "does not fit", "does not fit: needs 135.26 GiB per GPU of 78.20 GiB usable",
    )  # fmt: skip
    assert shown["ZeRO-2 mb=4x8"] == (
        "does not fit",
        "does not fit: needs 120.59 GiB per GPU of 78.20 GiB usable; it would be 6% faster",
    )
    assert shown["ZeRO-1 mb=2x16"] == (
        "tie", "ties within 2%: the article's order prefers ZeRO-2 before ZeRO-1",
    )  # fmt: skip
    assert shown["ZeRO-2 +ckpt mb=16x2"] == (
        "slower",
        "slower: +19.6% time per sample; its mb=32 does not fit: needs 136.26 GiB per GPU of "
        "78.20 GiB usable",
    )  # the family's faster micro-batch is why it is shown at 16
    assert shown["ZeRO-2 mb=1x32"] == ("slower", "slower: +11.1% time per sample")


def test_a_loss_inside_the_calibrations_error_is_called_close() -> None:
    shown = by_label(typical_error=0.10)
    assert shown["ZeRO-2 +offload(opt) mb=2x16"] == (
        "slower",
        "slower: +8.5% time per sample, inside the calibration's typical error (10%): the "
        "choice is close; its mb=32 does not fit: needs 824.84 GiB per GPU of 72.00 GiB usable",
    )
    assert shown["ZeRO-2 mb=1x32"] == ("slower", "slower: +11.1% time per sample")
