"""The ds_config keys DeepSpeed 0.19.8 knows, has deprecated or has removed.

Taken from DeepSpeed's config classes (``runtime/config.py``, ``runtime/zero/config.py``,
``runtime/zero/offload_config.py``) so that the linter needs no DeepSpeed import. DeepSpeed
rejects unknown keys inside ``zero_optimization`` but silently ignores unknown top-level keys,
which is how a typo like ``gradient_cliping`` goes unnoticed.
"""

from __future__ import annotations

TOP_LEVEL = frozenset(
    {
        "activation_checkpointing",
        "aio",
        "amp",
        "autotuning",
        "bf16",
        "bfloat16",
        "checkpoint",
        "comet",
        "comms_logger",
        "communication_data_type",
        "compile",
        "compression_training",
        "csv_monitor",
        "data_efficiency",
        "data_types",
        "dataloader_drop_last",
        "disable_allgather",
        "disable_python_gc",
        "dump_state",
        "expert_parallel",
        "flops_profiler",
        "fp16",
        "gradient_accumulation_steps",
        "gradient_allreduce_op",
        "gradient_clipping",
        "gradient_predivide_factor",
        "hybrid_engine",
        "log_level",
        "managed_gradient_accumulation",
        "memory_breakdown",
        "nebula",
        "optimizer",
        "pipeline",
        "prescale_gradients",
        "scheduler",
        "seq_parallel_communication_data_type",
        "sequence_parallel_size",
        "sparse_gradients",
        "steps_per_print",
        "tensor_parallel",
        "tensorboard",
        "timers",
        "torch_autocast",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "use_data_before_expert_parallelism",
        "vocabulary_size",
        "wall_clock_breakdown",
        "wandb",
        "weight_quantization",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "zero_optimization",
    }
)

REMOVED_TOP_LEVEL = {
    "elasticity": "elastic training was removed; set the three batch numbers directly",
    "sparse_attention": "DeepSpeed Sparse Attention was removed",
    "eigenvalue": "the eigenvalue (MoQ) block was removed",
    "graph_harvesting": "graph harvesting was removed",
    "curriculum_learning": "use data_efficiency.data_sampling.curriculum_learning",
    "progressive_layer_drop": "Progressive Layer Dropping was removed",
}

ZERO = frozenset(
    {
        "allgather_bucket_size",
        "allgather_partitions",
        "allgather_sequential",
        "compute_grad_norm",
        "contiguous_gradients",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "elastic_checkpoint",
        "enable_sanity_checks",
        "gather_16bit_weights_on_model_save",
        "ignore_unused_parameters",
        "leaf_module",
        "legacy_stage1",
        "load_from_fp32_weights",
        "log_trace_cache_warnings",
        "max_live_parameters",
        "max_reuse_distance",
        "memory_efficient_linear",
        "model_persistence_threshold",
        "module_granularity_threshold",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "override_module_apply",
        "param_persistence_threshold",
        "parameter_alignment",
        "pipeline_loading_checkpoint",
        "prefetch_bucket_size",
        "reduce_bucket_size",
        "reduce_scatter",
        "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory",
        "stage",
        "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold",
        "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size",
        "use_all_reduce_for_fetch_params",
        "use_multi_rank_bucket_allreduce",
        "zenflow",
        "zero_hpz_partition_size",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_weights",
    }
)

DEPRECATED_ZERO = {
    "cpu_offload": 'offload_optimizer: {"device": "cpu"}',
    "cpu_offload_param": 'offload_param: {"device": "cpu"}',
    "cpu_offload_use_pin_memory": "pin_memory inside offload_optimizer / offload_param",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}

REMOVED_ZERO = {
    "mics_shard_size": "MiCS sharding was removed",
    "mics_hierarchical_params_gather": "MiCS sharding was removed",
    "zeropp_loco_param": "LoCo-Zero++ was removed",
}

OFFLOAD_OPTIMIZER = frozenset(
    {
        "buffer_count",
        "cpuadam_cores_perc",
        "device",
        "fast_init",
        "nvme_path",
        "pin_memory",
        "pipeline_read",
        "pipeline_write",
        "ratio",
        "super_offload",
    }
)
OFFLOAD_PARAM = frozenset(
    {"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"}
)
