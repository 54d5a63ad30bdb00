"""The failure classifier, fed the lines real clusters and real training processes print."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.failures import Diagnosis, FailureClass, classify_failure, diagnose_failure
from workers.backends.oom_kills import oom_kill_evidence

TEXTS = Path(__file__).parent / "failure_texts"

CUDA_OOM = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 212, in <module>
    engine.backward(loss)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has \
78.12 GiB memory in use. Of the allocated memory 75.31 GiB is allocated by PyTorch, and 1.9 GiB \
is reserved by PyTorch but unallocated.
[rank3]:[W1130 02:11:09.123456 ProcessGroupNCCL.cpp:1250] Warning: destroy_process_group() was \
not called before program exit
"""

HIP_OOM = "RuntimeError: HIP out of memory. Tried to allocate 512.00 MiB (GPU 1; 63.98 GiB total)"

NCCL_WATCHDOG = """\
[rank1]:[E1130 02:40:02.507913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective \
operation timeout: WorkNCCL(SeqNum=5120, OpType=ALLREDUCE, NumelIn=262144000, \
NumelOut=262144000, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.
[rank1]:[E1130 02:40:02.508301 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Exception \
(either an error before or asyncError is set): NCCL error: remote process exited or there was \
a network error
"""

NCCL_SYSTEM_ERROR = """\
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/\
NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version \
2.21.5
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device \
error.
Last error:
socketStartConnect: Connect to 10.1.2.3<45123> failed : Software caused connection abort
"""

SLURM_CGROUP_OOM = """\
step 412 loss 2.3120 tokens/s 18233
slurmstepd: error: Detected 1 oom_kill event in StepId=4711.0. Some of the step tasks have \
been OOM Killed.
srun: error: gpu-node-07: task 0: Out Of Memory
"""

KERNEL_OOM_KILLED = """\
step 90 loss 3.0021 tokens/s 812
[2026-11-30 02:12:44,114] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 81231
Memory cgroup out of memory: Killed process 81231 (python3) total-vm:41223420kB
"""

CPU_ALLOCATOR = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
    "can't allocate memory: you tried to allocate 68719476736 bytes. Error code 12 "
    "(Cannot allocate memory)"
)

USER_TRACEBACK = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 40, in <module>
    main()
  File "/workspace/train.py", line 31, in main
    tokens = dataset[index]
KeyError: 'input_ids'
"""


def classify(
    *,
    exit_code: int | None = 1,
    native_state: str = "FAILED",
    reason: str = "",
    log_tail: str = "",
    runtime_tag: str | None = None,
) -> FailureClass:
    return classify_failure(
        exit_code=exit_code,
        native_state=native_state,
        reason=reason,
        log_tail=log_tail,
        runtime_tag=runtime_tag,
    )


@pytest.mark.parametrize(
    ("log_tail", "expected"),
    [
        (CUDA_OOM, FailureClass.OOM_GPU),
        (HIP_OOM, FailureClass.OOM_GPU),
        (
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
            "reported",
            FailureClass.OOM_GPU,
        ),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
            "`cublasCreate(handle)`",
            FailureClass.OOM_GPU,
        ),
        (NCCL_WATCHDOG, FailureClass.NCCL_TIMEOUT),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
            "waiting 1800000ms for recv operation to complete",
            FailureClass.NCCL_TIMEOUT,
        ),
        (NCCL_SYSTEM_ERROR, FailureClass.NCCL_ERROR),
        (
            "node-3:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
            "node-3:1234:1290 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
            "from peer 10.0.0.4<34567> with error 12",
            FailureClass.NCCL_ERROR,
        ),
        (SLURM_CGROUP_OOM, FailureClass.OOM_HOST),
        (KERNEL_OOM_KILLED, FailureClass.OOM_HOST),
        (CPU_ALLOCATOR, FailureClass.OOM_HOST),
        (
            "slurmstepd: error: *** JOB 4711 ON gpu-node-07 CANCELLED AT 2026-11-30T02:13:00 "
            "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
            FailureClass.NODE_LOST,
        ),
        (
            "slurmstepd: error: *** JOB 4712 ON gpu-node-02 CANCELLED AT 2026-11-30T06:00:04 "
            "DUE TO TIME LIMIT ***",
            FailureClass.TIMEOUT,
        ),
        (
            "/usr/bin/python3: can't open file '/workspace/trian.py': [Errno 2] No such file or "
            "directory",
            FailureClass.LAUNCH_ERROR,
        ),
        (USER_TRACEBACK, FailureClass.USER_ERROR),
    ],
)
def test_log_tail_names_the_failure(log_tail: str, expected: FailureClass) -> None:
    assert classify(log_tail=log_tail) == expected


def test_a_gpu_oom_beats_the_nccl_errors_it_causes_on_other_ranks() -> None:
    assert classify(log_tail=NCCL_WATCHDOG + CUDA_OOM) == FailureClass.OOM_GPU


@pytest.mark.parametrize(
    ("native_state", "expected"),
    [
        ("OUT_OF_MEMORY", FailureClass.OOM_HOST),
        ("OOMKilled", FailureClass.OOM_HOST),
        ("TIMEOUT", FailureClass.TIMEOUT),
        ("DEADLINE", FailureClass.TIMEOUT),
        ("DeadlineExceeded", FailureClass.TIMEOUT),
        ("NODE_FAIL", FailureClass.NODE_LOST),
        ("PREEMPTED", FailureClass.PREEMPTED),  # Slurm's preemption (PreemptMode=CANCEL)
        ("BOOT_FAIL", FailureClass.NODE_LOST),
        ("Evicted", FailureClass.NODE_LOST),
        ("CANCELLED by 0", FailureClass.CANCELLED),
        ("ImagePullBackOff", FailureClass.LAUNCH_ERROR),
        ("StartError", FailureClass.LAUNCH_ERROR),
        ("DisruptionTarget", FailureClass.NODE_LOST),
    ],
)
def test_cluster_state_names_the_failure(native_state: str, expected: FailureClass) -> None:
    assert classify(native_state=native_state, log_tail=USER_TRACEBACK) == expected


def test_cluster_state_beats_log_patterns() -> None:
    # Slurm killed the job for memory; the NCCL noise of the dying peers is a consequence.
    assert classify(native_state="OUT_OF_MEMORY", log_tail=NCCL_WATCHDOG) == FailureClass.OOM_HOST


def test_runtime_tag_beats_everything() -> None:
    tagged = classify(
        runtime_tag="OOM_GPU", native_state="OUT_OF_MEMORY", exit_code=137, log_tail=NCCL_WATCHDOG
    )
    assert tagged == FailureClass.OOM_GPU


def test_unknown_runtime_tag_is_ignored() -> None:
    assert classify(runtime_tag="SOMETHING_ELSE", log_tail=NCCL_WATCHDOG) == (
        FailureClass.NCCL_TIMEOUT
    )


def test_marker_line_in_the_log_is_read_as_a_tag() -> None:
    log_tail = "ZEROPILOT_FAILURE_CLASS=OOM_HOST MemoryError: unable to pin 8 GiB\n" + NCCL_WATCHDOG
    assert classify(log_tail=log_tail) == FailureClass.OOM_HOST


def test_the_last_marker_line_wins() -> None:
    log_tail = "ZEROPILOT_FAILURE_CLASS=NCCL_ERROR early\nZEROPILOT_FAILURE_CLASS=OOM_GPU CUDA\n"
    assert classify(log_tail=log_tail) == FailureClass.OOM_GPU


def test_sigkill_with_an_oom_killer_hint_is_host_oom() -> None:
    reason = "OOM: container exceeded its memory"
    assert classify(exit_code=137, native_state="Error", reason=reason) == FailureClass.OOM_HOST


def test_sigkill_without_a_hint_is_killed_not_the_users_error() -> None:
    assert classify(exit_code=137, log_tail="Killed\n") == FailureClass.KILLED


def test_command_not_found_exit_code_is_a_launch_error() -> None:
    assert classify(exit_code=127, log_tail="") == FailureClass.LAUNCH_ERROR


def test_plain_non_zero_exit_is_the_users_error() -> None:
    assert classify(exit_code=3, native_state="FAILED", log_tail="step 5 loss 2.1\n") == (
        FailureClass.USER_ERROR
    )


def test_out_of_memory_property_marks_only_the_memory_classes() -> None:
    memory = {c for c in FailureClass if c.out_of_memory}
    assert memory == {FailureClass.OOM_GPU, FailureClass.OOM_HOST}


def diagnose(*, exit_code: int | None = 1, native_state: str = "", log_tail: str = "",
             reason: str = "", runtime_tag: str | None = None,
             runtime_numbers: dict[str, int] | None = None) -> Diagnosis:  # fmt: skip
    return diagnose_failure(
        exit_code=exit_code,
        native_state=native_state,
        reason=reason,
        log_tail=log_tail,
        runtime_tag=runtime_tag,
        runtime_numbers=runtime_numbers,
    )


GIB, MIB = 1024**3, 1024**2

# CUDA texts cannot be produced without a GPU: these follow the format string of PyTorch's
# c10/cuda/CUDACachingAllocator.cpp (TORCH_CHECK_WITH(OutOfMemoryError, ...)): "CUDA out of
# memory. Tried to allocate <format_size>. GPU <n> has a total capacity of <size> of which <size>
# is free. " + reportProcessMemoryInfo ("Process <pid> has <size> memory in use. " per other
# process, then "Including non-PyTorch memory, this process has <size> memory in use. ") +
# "Of the allocated memory <size> is allocated by PyTorch, and <size> is reserved by PyTorch but
# unallocated. ..."; format_size prints two decimals and B/KiB/MiB/GiB.
CUDA_OOM_OTHERS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.50 GiB is free. Process 81231 has 30.25 GiB memory in use. "
    "Process 81302 has 10.00 GiB memory in use. Including non-PyTorch memory, this process has "
    "37.40 GiB memory in use. Of the allocated memory 35.10 GiB is allocated by PyTorch, and "
    "1.66 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
CUDA_OOM_OLD_FORMAT = (
    "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total "
    "capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total by "
    "PyTorch)"
)
# Produced here: examples/train_tiny.py, 2 DeepSpeed ranks on the CPU, ZeRO-0 mb=8, sequence 1024,
# hidden 128, --memory-cap-mib 130 from step 3 (RLIMIT_AS); the launcher's log tail.
DEEPSPEED_OVER_LIMIT = (TEXTS / "deepspeed_rank_over_address_space_limit.log").read_text()
# Produced here: the same run at mb=4, rank 1 killed with `kill -9`; the launcher exited 247.
DEEPSPEED_SIGKILLED = (TEXTS / "deepspeed_rank_sigkilled.log").read_text()
# Produced here: python -c "...setrlimit(RLIMIT_AS, 200 MiB); bytearray(300 MiB)".
PYTHON_MEMORYERROR = (TEXTS / "python_memoryerror_under_rlimit.log").read_text()


def test_cuda_oom_numbers_with_other_processes() -> None:
    found = diagnose(log_tail="step 7 loss 2.3\n" + CUDA_OOM_OTHERS)
    assert found.failure_class == FailureClass.OOM_GPU
    assert found.line.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert found.numbers["tried_bytes"] == 4 * GIB
    assert found.numbers["capacity_bytes"] == int(79.19 * GIB)
    assert found.numbers["free_bytes"] == int(1.5 * GIB)
    assert found.numbers["process_bytes"] == int(37.40 * GIB)
    assert found.numbers["other_processes_bytes"] == int(30.25 * GIB) + 10 * GIB
    assert found.numbers["other_processes"] == 2
    assert found.missing_bytes == int(2.5 * GIB)  # tried 4.00 minus 1.50 free


def test_cuda_oom_numbers_without_other_processes() -> None:
    found = diagnose(log_tail=CUDA_OOM)
    assert found.numbers["tried_bytes"] == 2 * GIB
    assert found.numbers["free_bytes"] == int(1.02 * GIB)
    assert "other_processes_bytes" not in found.numbers
    assert found.other_processes_bytes == 0


def test_cuda_oom_numbers_in_the_old_format() -> None:
    found = diagnose(log_tail=CUDA_OOM_OLD_FORMAT)
    assert found.failure_class == FailureClass.OOM_GPU
    assert (found.numbers["tried_bytes"], found.numbers["free_bytes"]) == (
        36 * MIB,
        int(47.06 * MIB),
    )
    assert found.missing_bytes == 36 * MIB  # enough was free: fragmentation refused it


def test_a_real_deepspeed_rank_over_its_address_space_limit_is_host_oom() -> None:
    found = diagnose(exit_code=1, log_tail=DEEPSPEED_OVER_LIMIT)
    assert found.failure_class == FailureClass.OOM_HOST
    assert "DefaultCPUAllocator: can't allocate memory" in found.line
    assert found.numbers["tried_bytes"] == 16777216


def test_the_runtimes_numbers_give_the_missing_bytes_of_a_host_oom() -> None:
    runtime = {"limit_bytes": 1537875968, "in_use_bytes": 1530000000, "rss_bytes": 600 * MIB}
    found = diagnose(
        log_tail=DEEPSPEED_OVER_LIMIT,
        runtime_tag="OOM_HOST",
        runtime_numbers=runtime,
    )
    assert found.source == "runtime tag"
    assert found.missing_bytes == 1530000000 + 16777216 - 1537875968
    assert found.numbers["exit_code"] == 1


def test_a_python_memoryerror_is_host_oom() -> None:
    found = diagnose(exit_code=1, log_tail=PYTHON_MEMORYERROR)
    assert (found.failure_class, found.line) == (FailureClass.OOM_HOST, "MemoryError")


def test_std_bad_alloc_is_host_oom() -> None:
    text = (
        "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc"
    )
    assert classify(exit_code=134, log_tail=text) == FailureClass.OOM_HOST


def test_a_real_sigkill_of_a_rank_is_killed_with_the_launchers_line() -> None:
    found = diagnose(exit_code=247, log_tail=DEEPSPEED_SIGKILLED)
    assert found.failure_class == FailureClass.KILLED
    assert found.lines[0] == "killed by SIGKILL (exit code 247)"
    assert found.lines[1].endswith("exits with return code = -9")


@pytest.mark.parametrize("exit_code", [137, -9, 247])
def test_every_sigkill_exit_code_with_oom_killer_words_is_host_oom(exit_code: int) -> None:
    text = "Memory cgroup out of memory: Killed process 81231 (python3) total-vm:41223420kB"
    found = diagnose(exit_code=exit_code, log_tail=text)
    assert found.failure_class == FailureClass.OOM_HOST
    assert found.lines == (text, f"killed by SIGKILL (exit code {exit_code})")


def test_a_cgroup_oom_kill_count_is_evidence_and_a_zero_count_is_not() -> None:
    events = "low 0\nhigh 0\nmax 41\noom 1\noom_kill {n}\n"
    assert classify(exit_code=247, log_tail=events.format(n=1)) == FailureClass.OOM_HOST
    assert classify(exit_code=247, log_tail=events.format(n=0)) == FailureClass.KILLED


@pytest.mark.parametrize(
    "text",
    [
        "python3 oom_train.py --steps 4",
        "train.py --oom-at-step 3 --oom_guard",
        "/data/zoom/run.log",
    ],
)
def test_file_and_argument_names_are_no_evidence_of_memory(text: str) -> None:
    assert classify(exit_code=137, log_tail=text) == FailureClass.KILLED


def test_slurm_out_of_memory_keeps_the_slurmstepd_line() -> None:
    found = diagnose(exit_code=0, native_state="OUT_OF_MEMORY", log_tail=SLURM_CGROUP_OOM)
    assert found.failure_class == FailureClass.OOM_HOST
    assert found.lines[0] == "cluster state OUT_OF_MEMORY"
    assert "oom_kill event" in found.lines[1] or "Out Of Memory" in found.lines[1]


def test_kubernetes_oomkilled_is_host_oom_with_its_state_line() -> None:
    found = diagnose(exit_code=137, native_state="OOMKilled", reason="pod trainer-0: OOMKilled")
    assert found.failure_class == FailureClass.OOM_HOST
    assert found.line == "cluster state OOMKilled: pod trainer-0: OOMKilled"


def test_a_users_error_shows_the_exception_line() -> None:
    tail = USER_TRACEBACK + "[launch.py:259:sigkill_handler] ... exits with return code = 1\n"
    found = diagnose(exit_code=1, log_tail=tail)
    assert (found.failure_class, found.line) == (FailureClass.USER_ERROR, "KeyError: 'input_ids'")


def test_the_record_stores_class_lines_numbers_and_missing_bytes() -> None:
    record = diagnose(log_tail=CUDA_OOM_OTHERS).as_record()
    assert record["failure_class"] == "OOM_GPU"
    assert record["source"] == "log"
    assert record["numbers"]["tried_bytes"] == 4 * GIB
    assert record["missing_bytes"] == int(2.5 * GIB)


def test_the_local_backends_cgroup_count_makes_a_sigkill_host_oom() -> None:
    reason = oom_kill_evidence(before=3, after=4)
    assert reason == "memory cgroup: oom_kill 1 while the attempt ran"
    assert classify(exit_code=247, reason=reason) == FailureClass.OOM_HOST
    assert oom_kill_evidence(before=3, after=3) == ""  # no kill while it ran: no evidence
    assert classify(exit_code=247, reason="") == FailureClass.KILLED


# The call chain of an OOM inside deepspeed.initialize at ZeRO-0 in bf16 (DeepSpeed 0.19.8's line
# numbers; Python's traceback format). No GPU here: the text is written, not captured.
INIT_OOM = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    engine, _, _, _ = deepspeed.initialize(model=model, config=ds_config)
  File "/venv/lib/python3.11/site-packages/deepspeed/__init__.py", line 569, in initialize
    engine = DeepSpeedEngine(args=args,
  File "/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 682, in __init__
    self._configure_optimizer(optimizer, model_parameters)
  File "/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 2582, in \
_configure_fp16_optimizer
    optimizer = FP16_Optimizer(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total \
capacity of 39.50 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has \
38.40 GiB memory in use. Of the allocated memory 37.31 GiB is allocated by PyTorch, and 0.5 GiB \
is reserved by PyTorch but unallocated.
"""


def test_an_oom_inside_deepspeed_initialize_is_marked_with_its_phase() -> None:
    at_init = diagnose(log_tail=INIT_OOM)
    in_training = diagnose(log_tail=CUDA_OOM)

    assert at_init.failure_class == FailureClass.OOM_GPU
    assert at_init.as_record()["phase"] == "initialize"
    assert in_training.failure_class == FailureClass.OOM_GPU
    assert "phase" not in in_training.as_record()


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("PreemptionByScheduler: Preempted in order to admit critical pod", FailureClass.PREEMPTED),
        ("EvictionByEvictionAPI: Eviction API: evicting", FailureClass.PREEMPTED),
        ("DeletionByTaintManager: Taint manager: deleting due to NoExecute taint",
         FailureClass.NODE_LOST),
        ("TerminationByKubelet: The node was low on resource: memory", FailureClass.NODE_LOST),
    ],
)  # fmt: skip
def test_a_disrupted_pod_is_a_preemption_when_the_cluster_made_room_or_drained(
    condition: str, expected: FailureClass
) -> None:
    reason = f"Failed: Pod ns/p-0 has condition DisruptionTarget; pod p-0 disrupted: {condition}"
    assert classify(native_state="DisruptionTarget", reason=reason) == expected
