"""The failure classifier, fed the lines real clusters and real training processes print."""

from __future__ import annotations

import pytest

from service.core.failures import FailureClass, classify_failure

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
        ("PREEMPTED", FailureClass.NODE_LOST),
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


def test_sigkill_without_a_hint_is_the_users_error() -> None:
    assert classify(exit_code=137, log_tail="Killed\n") == FailureClass.USER_ERROR


def test_command_not_found_exit_code_is_a_launch_error() -> None:
    assert classify(exit_code=127, log_tail="") == FailureClass.LAUNCH_ERROR


def test_plain_non_zero_exit_is_the_users_error() -> None:
    assert classify(exit_code=3, native_state="FAILED", log_tail="step 5 loss 2.1\n") == (
        FailureClass.USER_ERROR
    )


def test_out_of_memory_property_marks_only_the_memory_classes() -> None:
    memory = {c for c in FailureClass if c.out_of_memory}
    assert memory == {FailureClass.OOM_GPU, FailureClass.OOM_HOST}
