"""Failure classification: why did an attempt end, and the evidence that says so.

Every backend reports the same raw facts (exit code, the cluster's own state word, a reason, the
tail of the logs) and the training process may have tagged its own failure through
``zeropilot.runtime``, with the numbers it saw. ``diagnose_failure`` turns those facts into a
``Diagnosis``: a ``FailureClass``, the lines that show it (the one that ended the run first) and
the numbers parsed from them (bytes tried, capacity, free, held by others, the limit); the
escalation policy re-plans only on the out-of-memory classes, with those numbers. It is pure
(stdlib only) so that every layer and every test can call it.

Precedence, most trusted first: the runtime tag, the cluster's state word, what the logs say,
the exit code; anything left over is the user's own error. A SIGKILL is out-of-memory only with
evidence of memory (the OOM killer's own words, a cgroup ``oom_kill`` count, a cluster state);
without it, it is ``KILLED``, never the user's error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from service.core.oom_evidence import cuda_oom_numbers, host_oom_numbers, missing_bytes


class FailureClass(StrEnum):
    OOM_GPU = "OOM_GPU"  # the accelerator's allocator failed (CUDA/HIP/XPU out of memory)
    OOM_HOST = "OOM_HOST"  # host memory: OOM killer, cgroup limit, Slurm OUT_OF_MEMORY, OOMKilled
    NCCL_TIMEOUT = "NCCL_TIMEOUT"  # a collective hung until the process-group watchdog fired
    NCCL_ERROR = "NCCL_ERROR"  # the communicator failed for another reason
    HANG = (
        "HANG"  # no step for well past its own pace: zeropilot stopped it (service.core.progress)
    )
    NODE_LOST = "NODE_LOST"  # node failure, preemption, eviction: not the job's fault
    LAUNCH_ERROR = "LAUNCH_ERROR"  # image, command or quota: the training never started
    USER_ERROR = "USER_ERROR"  # any other non-zero exit of the training code
    KILLED = "KILLED"  # SIGKILL without evidence of memory: a node agent, a person, a watchdog
    TIMEOUT = "TIMEOUT"  # the job's own time limit or deadline
    CANCELLED = "CANCELLED"  # someone cancelled it
    PREEMPTED = "PREEMPTED"  # stopped on request and saved first: not a failure, costs no attempt

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
    "PREEMPTED": FailureClass.PREEMPTED,  # Slurm stopped it for another job: a preemption
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
    "FAILEDCREATE": FailureClass.LAUNCH_ERROR,  # the Job controller cannot create its pods
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
            r"oom[-_ ]kill(?! 0\b)|Out of memory: Kill|Memory cgroup out of memory|"
            r"DefaultCPUAllocator: (can't|not enough memory)|^\w*MemoryError\b|std::bad_alloc|"
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

# Words of the OOM killer and of the clusters that report it; "OOM" must stand alone, so that
# file and argument names (oom_train.py, --oom-at-step) are no evidence.
_OOM_KILLER_HINT = re.compile(
    r"(?<![\w./-])OOM(?![\w./-])|(?i:oom[-_ ]?kill(?:ed)?(?! 0\b)|out of memory)"
)
# A SIGKILLed process: 128 + 9 from a shell, -9 from Python's subprocess, 247 (-9 & 0xff) from
# a launcher that passes its child's -9 to sys.exit, as DeepSpeed's does.
SIGKILL_EXIT_CODES = (137, -9, 247)
_LAUNCH_EXIT_CODES = (126, 127)
_KILLED_RANK = re.compile(r"exits with return code = -9\b")  # DeepSpeed's launcher
# The last line of a Python traceback: "KeyError: 'input_ids'", "[rank1]: RuntimeError: ...".
_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]: ?)?[\w.]*(?:Error|Exception|Exit)\b", re.M
)  # the shell's "cannot execute" and "command not found"


@dataclass(frozen=True)
class Diagnosis:
    """A failure class, the lines that show it (the deciding one first) and their numbers."""

    failure_class: FailureClass
    source: str  # runtime tag | cluster state | log | exit code | none
    lines: tuple[str, ...] = ()
    numbers: dict[str, int] = field(default_factory=dict)
    phase: str | None = None  # "initialize": the traceback runs through deepspeed.initialize

    @property
    def line(self) -> str:
        """The line that ended the run, as the user should read it first."""
        return self.lines[0] if self.lines else ""

    @property
    def missing_bytes(self) -> int | None:
        return missing_bytes(self.numbers)

    @property
    def other_processes_bytes(self) -> int:
        return self.numbers.get("other_processes_bytes", 0)

    def as_record(self) -> dict[str, Any]:
        """What the attempt stores (JSON)."""
        record: dict[str, Any] = {
            "failure_class": str(self.failure_class),
            "source": self.source,
            "lines": list(self.lines),
            "numbers": dict(self.numbers),
        }
        if (missing := self.missing_bytes) is not None:
            record["missing_bytes"] = missing
        if self.phase:
            record["phase"] = self.phase
        return record


def classify_failure(
    *,
    exit_code: int | None,
    native_state: str,
    reason: str,
    log_tail: str,
    runtime_tag: str | None,
) -> FailureClass:
    """Name the class of one failed attempt from everything its backend and runtime reported."""
    return diagnose_failure(
        exit_code=exit_code,
        native_state=native_state,
        reason=reason,
        log_tail=log_tail,
        runtime_tag=runtime_tag,
    ).failure_class


def diagnose_failure(
    *,
    exit_code: int | None,
    native_state: str,
    reason: str,
    log_tail: str,
    runtime_tag: str | None,
    runtime_message: str = "",
    runtime_numbers: dict[str, int] | None = None,
) -> Diagnosis:
    """The class of one failed attempt, with its evidence lines and parsed numbers."""
    text = f"{reason}\n{log_tail}"
    found = (
        _tagged(runtime_tag, runtime_message, text)
        or _by_native_state(native_state, reason, text)
        or _by_marker(text)
        or _by_log(text)
        or _by_exit_code(exit_code, text)
        or Diagnosis(FailureClass.USER_ERROR, "none", _ending_line(text))
    )
    numbers = {**(runtime_numbers or {}), **found.numbers}  # the allocator's own words first
    lines = found.lines
    if exit_code is not None:
        numbers["exit_code"] = exit_code
        signal_line = f"killed by SIGKILL (exit code {exit_code})"
        if exit_code in SIGKILL_EXIT_CODES and signal_line not in lines:
            lines = (*lines, signal_line)
    phase = oom_phase(found.failure_class, text)
    return Diagnosis(found.failure_class, found.source, lines, numbers, phase)


# A frame of DeepSpeed's own initialize (deepspeed/__init__.py) in the traceback: the OOM came
# while the engine and its optimizer wrapper were built, before any training step.
_INITIALIZE_FRAME = re.compile(r'File "[^"\n]*deepspeed[/\\]__init__\.py", line \d+, in initialize')


def oom_phase(failure_class: FailureClass, text: str) -> str | None:
    """Where an out-of-memory failure happened, when the log says: "initialize" or None."""
    if failure_class.out_of_memory and _INITIALIZE_FRAME.search(text):
        return "initialize"
    return None


def _from_tag(tag: str | None) -> FailureClass | None:
    normalized = (tag or "").strip().upper()
    return FailureClass(normalized) if normalized in FailureClass.__members__ else None


def _tagged(tag: str | None, message: str, text: str) -> Diagnosis | None:
    failure_class = _from_tag(tag)
    if failure_class is None:
        return None
    evidence = _by_log(text)  # the traceback usually holds the same line with more numbers
    lines = tuple(ln for ln in (message, *(evidence.lines if evidence else ())) if ln)
    return Diagnosis(failure_class, "runtime tag", lines, _numbers(failure_class, "\n".join(lines)))


# A pod's DisruptionTarget condition says why: these two are the cluster making room or a
# drain (preemptions); the others (a lost node's taint, the kubelet's node pressure) are not.
_PREEMPTING_DISRUPTIONS = re.compile(r"\b(PreemptionByScheduler|EvictionByEvictionAPI)\b")


def _by_native_state(native_state: str, reason: str, text: str) -> Diagnosis | None:
    words = native_state.strip().split()  # Slurm says e.g. "CANCELLED by 0"
    failure_class = _NATIVE_STATES.get(words[0].upper()) if words else None
    if failure_class is None:
        return None
    if failure_class == FailureClass.NODE_LOST and _PREEMPTING_DISRUPTIONS.search(reason):
        failure_class = FailureClass.PREEMPTED
    lines = [f"cluster state {native_state.strip()}" + (f": {reason}" if reason else "")]
    if failure_class.out_of_memory and (hint := _matching_line(_OOM_KILLER_HINT, text)):
        lines.append(hint)
    return Diagnosis(failure_class, "cluster state", tuple(lines))


def _by_marker(text: str) -> Diagnosis | None:
    found = list(_MARKER.finditer(text))
    if not found:
        return None
    last = found[-1]  # the last tag is the one that ended the run
    failure_class = _from_tag(last[1])
    if failure_class is None:
        return None
    line = _line_at(text, last.start())
    return Diagnosis(failure_class, "log", (line,), _numbers(failure_class, line))


def _by_log(text: str) -> Diagnosis | None:
    for failure_class, pattern in _LOG_PATTERNS:
        if line := _matching_line(pattern, text):
            return Diagnosis(failure_class, "log", (line,), _numbers(failure_class, line))
    return None


def _by_exit_code(exit_code: int | None, text: str) -> Diagnosis | None:
    if exit_code in SIGKILL_EXIT_CODES:
        signal_line = f"killed by SIGKILL (exit code {exit_code})"
        if hint := _matching_line(_OOM_KILLER_HINT, text):
            return Diagnosis(FailureClass.OOM_HOST, "exit code", (hint, signal_line))
        launcher = _matching_line(_KILLED_RANK, text)  # which rank the launcher saw die
        lines = (signal_line, launcher) if launcher else (signal_line,)
        return Diagnosis(FailureClass.KILLED, "exit code", lines)
    if exit_code in _LAUNCH_EXIT_CODES:
        return Diagnosis(FailureClass.LAUNCH_ERROR, "exit code", _last_lines(text, 1))
    return None


def _numbers(failure_class: FailureClass, text: str) -> dict[str, int]:
    if failure_class == FailureClass.OOM_GPU:
        return cuda_oom_numbers(text)
    if failure_class == FailureClass.OOM_HOST:
        return host_oom_numbers(text)
    return {}


def _matching_line(pattern: re.Pattern[str], text: str) -> str | None:
    """The last line the pattern matches: the one closest to the end of the run."""
    found = list(pattern.finditer(text))
    return _line_at(text, found[-1].start()) if found else None


def _line_at(text: str, position: int) -> str:
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return text[start : end if end >= 0 else None].strip()[:1000]


def _last_lines(text: str, count: int) -> tuple[str, ...]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return tuple(lines[-count:])


def _ending_line(text: str) -> tuple[str, ...]:
    """The last exception a traceback names, else the last line: what the user reads first."""
    line = _matching_line(_EXCEPTION_LINE, text)
    return (line,) if line else _last_lines(text, 1)
