"""The job spec: what a team asks zeropilot to run, validated before anything is stored.

Every model forbids unknown keys so that a typo is an error naming the field, not a silently
ignored setting. Values that later reach a shell, a file name or a Kubernetes object name are
constrained here, at the door.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from service.core.launch_limits import (
    Arguments,
    Environment,
    FilePath,
    ImageReference,
)
from service.core.limits import (
    INT32_MAX,
    MAX_DIMENSION,
    MAX_LAYERS,
    MAX_PARAMETERS,
    MAX_TOKENS,
    plain_document,
)
from service.core.stopping import MAX_GRACE_S
from service.core.text import Text

# DNS-1123 label, shortened so that suffixes like "-a12-w3" still fit in 63 characters.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"

PositiveInt = Annotated[int, Field(gt=0, le=INT32_MAX)]
Dimension = Annotated[int, Field(gt=0, le=MAX_DIMENSION)]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Precision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


class OptimizerImpl(StrEnum):
    """Which implementation runs the step; their temporaries differ."""

    AUTO = "auto"  # FusedAdam on GPUs, torch.optim on the CPU, DeepSpeedCPUAdam under offload
    FUSED = "fused"
    TORCH = "torch"


class Offload(StrEnum):
    AUTO = "auto"
    NONE = "none"
    OPTIMIZER = "optimizer"
    ALL = "all"  # optimizer states and parameters (ZeRO-3 only)


class AttentionImpl(StrEnum):
    FLASH = "flash"  # flash / SDPA: no seq x seq score matrix kept
    EAGER = "eager"


class MlpKind(StrEnum):
    GATED = "gated"  # Llama-style: gate, up and down projections, no biases, RMSNorm
    PLAIN = "plain"  # GPT-style: up and down projections with biases, LayerNorm


class ModelSpec(Strict):
    """A decoder transformer: by Hugging Face config, by shape, or by parameter count alone."""

    # a config.json's content; the CLI inlines a path
    hf_config: Annotated[dict[str, Any], AfterValidator(plain_document)] | None = None
    parameters: Annotated[int, Field(gt=0, le=MAX_PARAMETERS)] | None = None
    hidden_size: Dimension | None = None
    num_layers: Annotated[int, Field(gt=0, le=MAX_LAYERS)] | None = None
    num_heads: Dimension | None = None
    num_kv_heads: Dimension | None = None
    ffn_size: Dimension | None = None
    vocab_size: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    tied_embeddings: bool = True
    mlp: MlpKind = MlpKind.PLAIN
    attention: AttentionImpl = AttentionImpl.FLASH

    @field_validator("hf_config", mode="before")
    @classmethod
    def _config_inline(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                f"a path ({value!r}) is read only by the zeropilot CLI, relative to the spec "
                "file; over HTTP send the config.json content inline"
            )
        return value

    @field_validator("hf_config")
    @classmethod
    def _config_readable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # here, not in the model check, so that a refusal's location is model.hf_config
        from service.core.advisor.hf_config import read_hf_config  # it imports this module

        if value is not None:
            read_hf_config(value)
        return value

    @model_validator(mode="after")
    def _shape_or_count(self) -> ModelSpec:
        shape = (self.hidden_size, self.num_layers, self.num_heads, self.vocab_size)
        if self.hf_config is not None:
            return self._check_hf_config(shape)
        if self.parameters is None and any(v is None for v in shape):
            raise ValueError(
                "give either model.parameters or the shape "
                "(hidden_size, num_layers, num_heads, vocab_size)"
            )
        if self.hidden_size and self.num_heads and self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.num_heads and self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        return self

    def _check_hf_config(self, shape: tuple[int | None, ...]) -> ModelSpec:
        if any(v is not None for v in (*shape, self.num_kv_heads, self.ffn_size)):
            raise ValueError("give either model.hf_config or the shape fields, not both")
        return self


class TrainingSpec(Strict):
    sequence_length: Tokens
    global_batch_size: Tokens
    micro_batch_size: Tokens | Literal["auto"] = "auto"
    gradient_accumulation_steps: Tokens | None = None
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.AUTO
    learning_rate: float = Field(default=3e-4, gt=0)
    gradient_clipping: float | None = Field(default=1.0, ge=0)
    # The job's length in optimizer steps, if known: placement ranks clusters by when the job
    # would end there, and a running job's expected end tells others when its GPUs free up.
    steps: PositiveInt | None = None

    def step_seconds(self, tokens_per_second: float | None) -> float | None:
        """One optimizer step's time at a pace of the whole job (None without one)."""
        if not tokens_per_second:
            return None
        return self.global_batch_size * self.sequence_length / tokens_per_second


class ResourcesSpec(Strict):
    cluster: Annotated[str, Field(pattern=NAME_PATTERN)] = "local"  # "auto": zeropilot places it
    # With cluster auto: the clusters it may go to (default: every profile).
    clusters: (
        Annotated[list[Annotated[str, Field(pattern=NAME_PATTERN)]], Field(max_length=64)] | None
    ) = None
    nodes: Annotated[int, Field(gt=0, le=65_536)] = 1
    gpus_per_node: Annotated[int, Field(gt=0, le=1024)] = 1
    time_limit_minutes: PositiveInt | None = None
    # With cluster auto: where it is predicted to end first (time), or cheapest (cost, from
    # each profile's usd_per_gpu_hour).
    placement: Literal["time", "cost"] = "time"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class ZeroSpec(Strict):
    stage: Literal["auto", 0, 1, 2, 3] = "auto"
    offload: Offload = Offload.AUTO
    activation_checkpointing: bool | Literal["auto"] = "auto"
    overrides: Annotated[dict[str, Any], AfterValidator(plain_document)] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _offload_needs_stage(self) -> ZeroSpec:
        if self.offload == Offload.ALL and self.stage not in ("auto", 3):
            raise ValueError(
                f"offload 'all' offloads parameters, which needs stage 3, not {self.stage}"
            )
        if self.offload == Offload.OPTIMIZER and self.stage == 0:
            raise ValueError("offload 'optimizer' needs ZeRO stage 1, 2 or 3, not 0")
        return self


class KeepBest(Strict):
    """Keep the checkpoint whose step's metric (``loss`` or a reported extra) is best."""

    metric: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-/]+$")]
    mode: Literal["min", "max"] = "min"


# Steps between saves, or "auto": from the job's measured saves and the cluster's observed
# interruptions (service.core.cadence).
IntervalSetting = PositiveInt | Literal["auto"]
AUTO_INTERVAL = "auto"


def _steps_or_auto(value: Any) -> Any:
    if isinstance(value, str) and value != AUTO_INTERVAL and not value.strip().isdigit():
        raise ValueError(f"give a number of steps (e.g. 100) or 'auto', not {value!r}")
    return value


class CheckpointSpec(Strict):
    dir: Text | None = None  # default: the job's folder on the cluster's shared storage
    # None: the cluster's default (its profile's checkpoint_interval_steps)
    interval_steps: Annotated[IntervalSetting, BeforeValidator(_steps_or_auto)] | None = None
    resume: bool = True
    # Seconds between SIGTERM (save now) and SIGKILL when the job is stopped; default: sized
    # from its measured saves (service.core.stopping).
    grace_s: Annotated[int, Field(ge=1, le=MAX_GRACE_S)] | None = None
    # Retention (service.core.retention): the newest complete checkpoints, a permanent one
    # every N steps, the best by a metric; the worker deletes the rest during the run.
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 2
    keep_every_steps: PositiveInt | None = None
    keep_best: KeepBest | None = None


class EscalationSpec(Strict):
    enabled: bool = True
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 4


class HealthSpec(Strict):
    """When a running attempt counts as hung (service.core.progress): no step for the longer
    of ``hang_floor_s`` and ``hang_factor`` x its step time, or none ``first_step_s`` after it
    started. A hung attempt's ranks print their stacks, it is stopped and resumed."""

    watch: bool = True
    hang_floor_s: Annotated[float, Field(ge=1, le=86_400)] = 300.0
    hang_factor: Annotated[float, Field(ge=2, le=1000)] = 10.0
    first_step_s: Annotated[float, Field(ge=10, le=86_400)] = 1800.0


class JobSpec(Strict):
    """One training job as a team submits it."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    team: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    # Values the launch hands to a process, a script or a pod: see launch_limits.
    entrypoint: FilePath
    args: Arguments = Field(default_factory=list)
    image: ImageReference | None = None
    working_dir: FilePath | None = None
    env: Environment = Field(default_factory=dict)
    model: ModelSpec
    training: TrainingSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    zero: ZeroSpec = Field(default_factory=ZeroSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    escalation: EscalationSpec = Field(default_factory=EscalationSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    priority: Annotated[int, Field(ge=0, le=100)] = 50

    @model_validator(mode="after")
    def _batch_numbers_agree(self) -> JobSpec:
        check_batch_numbers(self.training, self.resources.world_size)
        return self


def check_batch_numbers(training: TrainingSpec, data_parallel: int) -> None:
    """Raise ValueError naming the numbers when global = micro x accumulation x dp cannot hold."""
    total = training.global_batch_size
    if total % data_parallel:
        raise ValueError(
            f"training.global_batch_size ({total}) is not divisible by the data-parallel size "
            f"({data_parallel} = nodes x gpus_per_node)"
        )
    micro, accumulation = training.micro_batch_size, training.gradient_accumulation_steps
    per_rank = total // data_parallel
    if micro != "auto" and per_rank % micro:
        raise ValueError(
            f"training.micro_batch_size ({micro}) does not divide the per-rank batch ({per_rank} = "
            f"global_batch_size {total} / data-parallel size {data_parallel})"
        )
    if micro != "auto" and accumulation is not None and micro * accumulation != per_rank:
        raise ValueError(
            f"train_batch_size must equal micro x accumulation x data-parallel size, but "
            f"{micro} x {accumulation} x {data_parallel} = {micro * accumulation * data_parallel} "
            f"!= global_batch_size {total}"
        )
    if micro == "auto" and accumulation is not None and per_rank % accumulation:
        raise ValueError(
            f"training.gradient_accumulation_steps ({accumulation}) does not divide the per-rank "
            f"batch ({per_rank})"
        )
