"""A tiny GPT-style model trained with a real DeepSpeed engine, for demos and tests.

The tokens are random, but each sequence follows a fixed affine rule from a random start, so a
working training loop shows its loss falling within a few dozen steps. It runs on the CPU (gloo)
or on GPUs, reports to zeropilot through ``zeropilot.runtime`` and saves DeepSpeed checkpoints
that a later attempt can resume from.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import deepspeed
import torch
from torch import nn

from zeropilot.resume_weights import load_weights
from zeropilot.runtime import (
    STOPPED_EXIT_CODE,
    Reporter,
    ResumePoint,
    checkpoint_dir,
    resume_point,
)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.pos = nn.Embedding(args.seq_len, args.hidden)
        self.blocks = nn.ModuleList(
            Block(args.hidden, args.heads, 4 * args.hidden) for _ in range(args.layers)
        )
        self.norm = nn.LayerNorm(args.hidden)
        self.head = nn.Linear(args.hidden, args.vocab, bias=False)
        self.checkpoint_activations = args.activation_checkpointing

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        for block in self.blocks:
            if self.checkpoint_activations and self.training:
                x = deepspeed.checkpointing.checkpoint(block, x)
            else:
                x = block(x)
        return self.head(self.norm(x))


def make_batch(batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    steps = torch.arange(seq_len + 1).unsqueeze(0)
    return (start * 5 + steps * 3) % vocab  # learnable: each token fixes the next


def memory_peak_bytes(device: torch.device) -> int:
    """The allocator's peak on a GPU; the process's peak resident size on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def address_space_bytes() -> int:
    """This process's virtual memory size (VmSize), what RLIMIT_AS limits."""
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmSize:"))
    return int(kib) * 1024


@contextmanager
def memory_cap(growth_mib: int) -> Iterator[None]:
    """Within the block, let this rank map at most ``growth_mib`` more than it has now
    (RLIMIT_AS), so that a plan whose training step needs more really runs out of host memory,
    as on a tighter machine. Checkpoint writes happen outside it: the cap is the step's.

    Run it with ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment: glibc then maps every large
    tensor on its own and unmaps it when freed, so the address space follows live memory.
    """
    if growth_mib <= 0:
        yield
        return
    before = resource.getrlimit(resource.RLIMIT_AS)
    limit = address_space_bytes() + growth_mib * 1024**2
    resource.setrlimit(resource.RLIMIT_AS, (limit, before[1]))
    yield  # a step that fails leaves the cap in place: the OOM guard reports it as evidence
    resource.setrlimit(resource.RLIMIT_AS, before)


def load_resume_point(engine: deepspeed.DeepSpeedEngine, resume: ResumePoint) -> int:
    """Load the checkpoint zeropilot chose through the engine (see zeropilot.runtime)."""
    full = resume.load_optimizer_states
    _, client_state = engine.load_checkpoint(
        resume.load_dir,
        tag=resume.tag,
        load_module_only=not full,
        load_optimizer_states=full,
        load_lr_scheduler_states=full,
    )
    step = int((client_state or {}).get("step", 0))
    print(f"resumed from {resume.load_dir}/{resume.tag} at step {step} ({resume.method})")
    return step


DIE_MID_SAVE_AT_STEP = int(os.environ.get("TINY_DIE_MID_SAVE_AT_STEP", "0"))  # tests only


def _write_half_then_die(obj: object, path: str, *args: object, **kwargs: object) -> None:
    """Tests: rank 1's save is cut off halfway by SIGKILL, as a killed node's would be."""
    buffer = io.BytesIO()
    _TORCH_SAVE(obj, buffer)
    with open(path, "wb") as out:
        out.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


_TORCH_SAVE = torch.save


def save(engine: deepspeed.DeepSpeedEngine, reporter: Reporter, save_dir: str, step: int) -> str:
    """Save a checkpoint on every rank; rank 0 reports it once DeepSpeed has written it all."""
    tag = f"global_step{step}"
    began = time.perf_counter()
    if step == DIE_MID_SAVE_AT_STEP and torch.distributed.get_rank() == 1:
        torch.save = _write_half_then_die  # type: ignore[assignment]
    engine.save_checkpoint(save_dir, tag=tag, client_state={"step": step})
    path = os.path.join(save_dir, tag)
    if torch.distributed.get_rank() == 0:
        reporter.checkpoint(step, path, seconds=time.perf_counter() - began)
    return path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--checkpoint-interval",
        type=int,
        default=None,
        help="steps between saves; default: zeropilot's interval, followed as it changes "
        "(checkpoint.interval_steps: auto), or 20 outside zeropilot",
    )
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        default=os.environ.get("ZEROPILOT_ACTIVATION_CHECKPOINTING") == "1",
    )
    parser.add_argument(
        "--memory-cap-mib",
        type=int,
        default=int(os.environ.get("TINY_MEMORY_CAP_MIB", "0")),
        help="from --memory-cap-at-step on, each training step may map only this many MiB more "
        "than the rank holds between steps (RLIMIT_AS); 0: no cap",
    )
    parser.add_argument(
        "--memory-cap-at-step",
        type=int,
        default=int(os.environ.get("TINY_MEMORY_CAP_AT_STEP", "1")),
        help="the step from which the cap holds (later than 1: a checkpoint exists before it)",
    )
    parser.add_argument("--fail-at-step", type=int, default=0, help="exit 3 at this step (tests)")
    parser.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds more per step (tests: a steady pace)"
    )
    parser.add_argument(
        "--ignore-sigterm", action="store_true", help="do not save on SIGTERM (tests: the grace)"
    )
    parser.add_argument("--oom-at-step", type=int, default=0, help="raise an OOM here (tests)")
    parser.add_argument(
        "--oom-without-checkpointing-at-step",
        type=int,
        default=0,
        help="raise the allocator's OOM at this step unless activation checkpointing is on: "
        "a stand-in, on machines without GPUs, for a model whose activations do not fit",
    )
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    reporter = Reporter.from_env()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        reporter.watch_for_stop()  # a stop (cancel, preemption) saves first
    resume = resume_point()  # before the engine: a universal resume converts the checkpoint first
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = TinyGPT(args)
    start_step = 0
    if resume is not None and resume.before_engine:
        start_step = load_weights(model, resume)
        print(f"resumed from {resume.load_dir}/{resume.tag} at step {start_step} (weights)")
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    save_dir = checkpoint_dir()
    if resume is not None and not resume.before_engine:
        start_step = load_resume_point(engine, resume)
    rank = torch.distributed.get_rank()
    generator = torch.Generator().manual_seed(1234 + rank)
    micro = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    for _ in range(start_step * accumulation):  # a resumed run goes on with the data it had next
        make_batch(micro, args.seq_len, args.vocab, generator)
    with reporter.oom_guard():
        for step in range(start_step + 1, args.steps + 1):
            began = time.perf_counter()
            loss_sum = 0.0
            cap = args.memory_cap_mib if step >= args.memory_cap_at_step else 0
            with memory_cap(cap):
                for _ in range(accumulation):
                    if step == args.oom_at_step or (
                        step == args.oom_without_checkpointing_at_step
                        and not args.activation_checkpointing
                    ):
                        raise torch.OutOfMemoryError(
                            "CUDA out of memory. Tried to allocate 2.00 GiB"
                        )
                    tokens = make_batch(micro, args.seq_len, args.vocab, generator)
                    logits = engine(tokens[:, :-1].to(engine.device))
                    loss = nn.functional.cross_entropy(
                        logits.reshape(-1, args.vocab).float(),
                        tokens[:, 1:].to(engine.device).reshape(-1),
                    )
                    engine.backward(loss)
                    engine.step()
                    loss_sum += loss.item()
            time.sleep(args.step_sleep)
            if step == args.fail_at_step:
                # Exit 3 on every rank without the interpreter's teardown: there a rank's process
                # group can abort (SIGABRT) once a peer has gone, and DeepSpeed's launcher
                # reports whichever failed rank it polls first (CI once saw 250, not 3).
                sys.stdout.flush()
                os._exit(3)
            elapsed = time.perf_counter() - began
            tokens_per_s = micro * accumulation * args.seq_len * engine.dp_world_size / elapsed
            if rank == 0 and step % args.log_interval == 0:
                mean_loss = loss_sum / accumulation
                print(f"step {step} loss {mean_loss:.4f} tokens/s {tokens_per_s:.0f}", flush=True)
                reporter.metrics(
                    step,
                    loss=mean_loss,
                    tokens_per_s=tokens_per_s,
                    memory_peak_bytes=memory_peak_bytes(engine.device),
                )
            if args.checkpoint_interval:
                due = step % args.checkpoint_interval == 0
            else:  # every rank asks: rank 0 knows zeropilot's interval and decides for all
                due = reporter.checkpoint_due(step, default=20)
            saved = due or step == args.steps
            if saved:
                save(engine, reporter, save_dir, step)
            if step < args.steps and reporter.stop_requested():  # every rank, every step
                tag = os.path.join(save_dir, f"global_step{step}")
                path = tag if saved else save(engine, reporter, save_dir, step)
                if rank == 0:
                    reporter.stopped(step, path)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(STOPPED_EXIT_CODE)  # saved: no teardown to abort in (see the end)
    # Only after success (a rank that failed must not wait here for the others). Without it,
    # gloo's threads can outlive the interpreter and abort a finished rank ("terminate called
    # without an active exception", exit -6), as one CI run saw under load.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # Past destroy_process_group a C++ thread can still abort a finished rank in the
    # interpreter's teardown (CI saw it once with ZeRO-3 on CPU: exit -6 after the last step).
    # Every checkpoint and report is written by now, so leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
