"""A tiny Llama trained by the Hugging Face Trainer under zeropilot; nothing is downloaded.

The model is built from ``config.json`` beside this file, the text is made here (sentences about
a few animals, tokenized by character code), and the only zeropilot code is
``training_arguments`` and ``ZeropilotCallback``: zeropilot's plan sets the batch, accumulation,
precision, checkpointing, ds_config and output folder, and the callback reports to it.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback

from zeropilot.hf import ZeropilotCallback, training_arguments

HERE = Path(__file__).resolve().parent


def make_text(sentences: int, seed: int = 0) -> str:
    """A small corpus with structure a model can learn in a few steps."""
    rng = random.Random(seed)
    animals, verbs = ["cat", "dog", "fox", "owl", "elk"], ["sees", "chases", "greets", "hears"]
    lines = [f"the {rng.choice(animals)} {rng.choice(verbs)} the {rng.choice(animals)}."]
    lines += [
        f"the {rng.choice(animals)} {rng.choice(verbs)} the {rng.choice(animals)}."
        for _ in range(sentences - 1)
    ]
    return " ".join(lines)


class CharBlocks(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Fixed-length blocks of character codes (below the config's vocab size of 128)."""

    def __init__(self, text: str, seq_len: int) -> None:
        codes = torch.tensor([min(ord(c), 127) for c in text], dtype=torch.long)
        self.blocks = codes[: len(codes) // seq_len * seq_len].view(-1, seq_len)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


class StepMemoryCap(TrainerCallback):
    """Tests only: from step ``at`` on, each training step may map ``mib`` MiB more than the
    rank holds between steps (RLIMIT_AS), so a plan whose step needs more really runs out of
    host memory, as on a tighter machine (see tests/e2e/test_hf_trainer.py)."""

    def __init__(self, mib: int, at: int) -> None:
        self.mib, self.at = mib, at
        self.before = resource.getrlimit(resource.RLIMIT_AS)

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.mib > 0 and state.global_step + 1 >= self.at:
            with open("/proc/self/status") as status:
                kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
            limit = kib * 1024 + self.mib * 1024**2
            resource.setrlimit(resource.RLIMIT_AS, (limit, self.before[1]))

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        resource.setrlimit(resource.RLIMIT_AS, self.before)  # saves run outside the cap


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--save-steps", type=int, default=0, help="0: zeropilot's interval")
    parser.add_argument("--memory-cap-mib", type=int, default=0, help="tests: see StepMemoryCap")
    parser.add_argument("--memory-cap-at-step", type=int, default=1)
    # DeepSpeed's launcher adds --local_rank and zeropilot --deepspeed_config: the Trainer
    # reads both from the environment and the plan instead.
    known, _ = parser.parse_known_args()
    return known


def main() -> None:
    args = parse_args()
    extra = {"save_steps": args.save_steps} if args.save_steps else {}
    training = training_arguments(
        max_steps=args.max_steps,
        logging_steps=1,
        report_to="none",
        lr_scheduler_type="constant",
        dataloader_num_workers=0,
        seed=0,
        **extra,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_json_file(HERE / "config.json"))
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=CharBlocks(make_text(4000), args.seq_len),
        callbacks=[
            ZeropilotCallback(),
            StepMemoryCap(args.memory_cap_mib, args.memory_cap_at_step),
        ],
    )
    trainer.train(resume_from_checkpoint=training.resume_from_checkpoint)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # past the last save: no interpreter teardown to abort in (see train_tiny.py)
