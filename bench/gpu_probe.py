"""One DeepSpeed training run on this machine's GPU(s); prints one JSON line per rank.

Made from ../shared/data/h200-2026-11-30/probe.py (the probe behind bench/data/h200_runs.jsonl,
same fields) with three additions for bench/gpu_calibrate.py: ``"optimizer": "fused"`` runs
DeepSpeed's default FusedAdam instead of torch's AdamW, several ranks (under the ``deepspeed``
launcher) record ``world_size``, and ``context`` is what the device holds beyond PyTorch's
reserved memory (the CUDA context and library workspaces).

Usage: python bench/gpu_probe.py '{"model": {...}, "seq": 1024, "mb": 1, "stage": 0, ...}'
"""

import json
import os
import sys
import time
import traceback

spec = json.loads(sys.argv[1])
for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
    os.environ.setdefault(key, value)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(spec.get("port", 29511)))

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

cuda = torch.cuda.is_available()
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
out = {"spec": spec, "torch": torch.__version__, "deepspeed": deepspeed.__version__}
out.update(world_size=world, rank=int(os.environ["RANK"]))


def peak() -> int:
    return torch.cuda.max_memory_allocated() if cuda else 0


def ds_config_for(spec: dict) -> dict:
    mb, stage = spec["mb"], spec["stage"]
    zero = {"stage": stage, **spec.get("zero", {})}
    if spec.get("offload_optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if spec.get("offload_param"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    params = {"lr": 1e-4}
    if spec.get("optimizer", "torch") == "torch":
        params["torch_adam"] = True
    return {
        "train_batch_size": mb * world,
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": params},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
    }


def build(spec: dict, ds_config: dict) -> LlamaForCausalLM:
    m = spec["model"]
    config = LlamaConfig(
        hidden_size=m["hidden"],
        num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"],
        intermediate_size=m["ffn"],
        vocab_size=m["vocab"],
        max_position_embeddings=spec["seq"],
        tie_word_embeddings=False,
    )
    config._attn_implementation = spec.get("attn", "sdpa")
    if spec["stage"] == 3:
        remote = "cpu" if spec.get("offload_param") else None
        with deepspeed.zero.Init(config_dict_or_path=ds_config, remote_device=remote):
            return LlamaForCausalLM(config)
    with dev:
        return LlamaForCausalLM(config)


phase = "setup"
try:
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    ds_config = ds_config_for(spec)
    out["ds_config"] = ds_config
    phase = "build"
    model = build(spec, ds_config)
    out["params"] = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if spec.get("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    phase = "initialize"
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config
    )
    if cuda:
        torch.cuda.synchronize()
        out["init_peak"], out["after_init"] = peak(), torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    phase = "train"
    times = []
    for _ in range(spec.get("steps", 4)):
        ids = torch.randint(0, spec["model"]["vocab"], (spec["mb"], spec["seq"]), device=dev)
        began = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    out["loss"] = float(loss.detach())
    warmup = min(int(spec.get("warmup", 1)), len(times) - 1)  # the first steps build caches
    later = sorted(times[warmup:]) or times
    out["step_s"] = later[len(later) // 2]
    out["step_times_s"] = times  # every step, warm-up included, for the time model's fit
    out["tokens_per_s"] = spec["mb"] * spec["seq"] / out["step_s"]
    if cuda:
        out["train_peak"] = peak()
        out["train_reserved"] = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        out["total"] = torch.cuda.get_device_properties(dev).total_memory
        out["context"] = total - free - torch.cuda.memory_reserved()  # others' processes too
    out["ok"] = True
except torch.OutOfMemoryError as e:
    out.update(ok=False, oom=True, phase=phase, error=str(e).splitlines()[0][:300])
    out["peak_before"] = peak()
except Exception as e:
    out.update(ok=False, oom=False, phase=phase, error=repr(e)[:500])
    out["tb"] = traceback.format_exc()[-1500:]
print("PROBE " + json.dumps(out), flush=True)
