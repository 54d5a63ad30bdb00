"""Loading a checkpoint's weights into a model before DeepSpeed partitions it.

The ``weights`` resume method (see ``zeropilot.runtime.ResumePoint``): used where DeepSpeed
cannot carry the optimizer across a change of ZeRO stage. Kept apart from ``zeropilot.runtime``
because it needs torch and DeepSpeed, which the runtime helper never imports.
"""

from __future__ import annotations

import glob
import os

import torch
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

from zeropilot.runtime import ResumePoint


def load_weights(model: torch.nn.Module, point: ResumePoint) -> int:
    """Load the checkpoint's weights into ``model`` (unwrapped, before ``deepspeed.initialize``)
    and return the step it was saved at. From ZeRO-1/2/3 the fp32 master weights are
    consolidated (DeepSpeed's zero_to_fp32); from ZeRO-0 the module's own are taken."""
    folder = os.path.join(point.load_dir, point.tag)
    model_files = sorted(glob.glob(os.path.join(folder, "*mp_rank_00_model_states.pt")))
    if not model_files:
        raise FileNotFoundError(f"no model states file in {folder}")
    saved = torch.load(model_files[0], map_location="cpu", weights_only=False)
    if glob.glob(os.path.join(folder, "*_optim_states.pt")):  # partitioned: ZeRO-1/2/3
        weights = get_fp32_state_dict_from_zero_checkpoint(point.load_dir, tag=point.tag)
    else:
        weights = saved["module"]
    model.load_state_dict(weights)
    return int(saved.get("step", saved.get("global_steps", 0)))
