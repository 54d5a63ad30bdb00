"""Failure classification: why did an attempt end, in one of a few classes the policy acts on.

Every backend reports the same raw facts (exit code, the cluster's own state word, a reason, the
tail of the logs) and the training process may have tagged its own failure through
``zeropilot.runtime``. This module turns those facts into a ``FailureClass``; the escalation policy
relaunches only on the out-of-memory classes. It is pure (stdlib only) so that every layer and
every test can call it.

Precedence, most trusted first: the runtime tag, the cluster's state word, what the logs say,
the exit code; anything left over is the user's own error.
"""

from __future__ import annotations

import re
from enum import StrEnum


class FailureClass(StrEnum):
    OOM_GPU = "OOM_GPU"  # the accelerator's allocator failed (CUDA/HIP/XPU out of memory)
    OOM_HOST = "OOM_HOST"  # host memory: OOM killer, cgroup limit, Slurm OUT_OF_MEMORY, OOMKilled
    NCCL_TIMEOUT = "NCCL_TIMEOUT"  # a collective hung until the process-group watchdog fired
    NCCL_ERROR = "NCCL_ERROR"  # the communicator failed for another reason
    NODE_LOST = "NODE_LOST"  # node failure, preemption, eviction: not the job's fault
    LAUNCH_ERROR = "LAUNCH_ERROR"  # image, command or quota: the training never started
    USER_ERROR = "USER_ERROR"  # any other non-zero exit of the training code
    TIMEOUT = "TIMEOUT"  # the job's own time limit or deadline
    CANCELLED = "CANCELLED"  # someone cancelled it

    @property
    def out_of_memory(self) -> bool:
        """Whether the escalation ladder may answer this failure."""
        return self in (FailureClass.OOM_GPU, FailureClass.OOM_HOST)


# The cluster's own state word (Slurm job state, Kubernetes pod/job reason), upper-cased.
_NATIVE_STATES: dict[str, FailureClass] = {
    "OUT_OF_MEMORY": FailureClass.OOM_HOST,
    "OOMKILLED": FailureClass.OOM_HOST,
    "TIMEOUT": FailureClass.TIMEOUT,
    "DEADLINE": FailureClass.TIMEOUT,
    "DEADLINEEXCEEDED": FailureClass.TIMEOUT,
    "NODE_FAIL": FailureClass.NODE_LOST,
    "PREEMPTED": FailureClass.NODE_LOST,
    "BOOT_FAIL": FailureClass.NODE_LOST,
    "EVICTED": FailureClass.NODE_LOST,
    "NODELOST": FailureClass.NODE_LOST,
    "NODESHUTDOWN": FailureClass.NODE_LOST,
    "DISRUPTIONTARGET": FailureClass.NODE_LOST,
    "CANCELLED": FailureClass.CANCELLED,
    "ERRIMAGEPULL": FailureClass.LAUNCH_ERROR,
    "IMAGEPULLBACKOFF": FailureClass.LAUNCH_ERROR,
    "INVALIDIMAGENAME": FailureClass.LAUNCH_ERROR,
    "CREATECONTAINERERROR": FailureClass.LAUNCH_ERROR,
    "CREATECONTAINERCONFIGERROR": FailureClass.LAUNCH_ERROR,
    "RUNCONTAINERERROR": FailureClass.LAUNCH_ERROR,
    "CONTAINERCANNOTRUN": FailureClass.LAUNCH_ERROR,
    "STARTERROR": FailureClass.LAUNCH_ERROR,  # containerd could not start it (exit code 128)
}

_MARKER = re.compile(r"ZEROPILOT_FAILURE_CLASS=([A-Z_]+)")

# Log patterns, in order: a GPU OOM on one rank often makes the other ranks' NCCL calls fail or
# time out, so the root cause (memory) is looked for before its consequences (communication).
_LOG_PATTERNS: tuple[tuple[FailureClass, re.Pattern[str]], ...] = (
    (
        FailureClass.OOM_GPU,
        re.compile(
            r"(CUDA|HIP|XPU|MPS) (error: )?out of memory|OutOfMemoryError|"
            r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|"
            r"NCCL WARN Cuda failure 'out of memory'",
            re.IGNORECASE,
        ),
    ),
    (
        FailureClass.OOM_HOST,
        re.compile(
            r"oom[-_ ]kill|Out of memory: Kill|Memory cgroup out of memory|"
            r"DefaultCPUAllocator: (can't|not enough memory)|^MemoryError\b|"
            r"Cannot allocate memory|exceeded (job )?memory limit",
            re.IGNORECASE | re.MULTILINE,
        ),
    ),
    (FailureClass.NODE_LOST, re.compile(r"DUE TO (NODE FAILURE|PREEMPTION)|Node failure on")),
    (FailureClass.TIMEOUT, re.compile(r"DUE TO (TIME LIMIT|DEADLINE)")),
    (
        FailureClass.NCCL_TIMEOUT,
        re.compile(
            r"Watchdog caught collective operation timeout|collective operation timeout|"
            r"Timed out waiting \d+ms for (send|recv)|ncclCommWatchdog.*time",
            re.IGNORECASE,
        ),
    ),
    (
        FailureClass.NCCL_ERROR,
        re.compile(
            r"NCCL error|nccl(Internal|System|Invalid|Remote|UnhandledCuda)(Error|Usage|Argument)|"
            r"NCCL WARN|DistBackendError|ProcessGroupNCCL.*(abort|error)",
            re.IGNORECASE,
        ),
    ),
    (
        FailureClass.LAUNCH_ERROR,
        re.compile(
            r"can't open file .*No such file|command not found|"
            r"No module named '?deepspeed|execve\(\): .*: (No such file|Permission denied)"
        ),
    ),
)

_OOM_KILLER_HINT = re.compile(r"\boom|out of memory", re.IGNORECASE)
_SIGKILL_EXIT_CODES = (137, -9)
_LAUNCH_EXIT_CODES = (126, 127)  # the shell's "cannot execute" and "command not found"


def classify_failure(
    *,
    exit_code: int | None,
    native_state: str,
    reason: str,
    log_tail: str,
    runtime_tag: str | None,
) -> FailureClass:
    """Name the class of one failed attempt from everything its backend and runtime reported."""
    text = f"{reason}\n{log_tail}"
    return (
        _from_tag(runtime_tag)
        or _from_native_state(native_state)
        or _from_marker(text)
        or _from_log(text)
        or _from_exit_code(exit_code, text)
        or FailureClass.USER_ERROR
    )


def _from_tag(tag: str | None) -> FailureClass | None:
    normalized = (tag or "").strip().upper()
    return FailureClass(normalized) if normalized in FailureClass.__members__ else None


def _from_native_state(native_state: str) -> FailureClass | None:
    words = native_state.strip().split()  # Slurm says e.g. "CANCELLED by 0"
    return _NATIVE_STATES.get(words[0].upper()) if words else None


def _from_marker(text: str) -> FailureClass | None:
    found = _MARKER.findall(text)
    return _from_tag(found[-1]) if found else None  # the last tag is the one that ended the run


def _from_log(text: str) -> FailureClass | None:
    for failure_class, pattern in _LOG_PATTERNS:
        if pattern.search(text):
            return failure_class
    return None


def _from_exit_code(exit_code: int | None, text: str) -> FailureClass | None:
    if exit_code in _SIGKILL_EXIT_CODES and _OOM_KILLER_HINT.search(text):
        return FailureClass.OOM_HOST
    if exit_code in _LAUNCH_EXIT_CODES:
        return FailureClass.LAUNCH_ERROR
    return None
