"""In-job runtime helper: report metrics, checkpoints and failure tags from a training process.

zeropilot starts every rank with a few ``ZEROPILOT_*`` variables in its environment. This module
reads them and talks to the API with the attempt's own token. It imports only the standard
library so that it works in any training image, and a reporting failure never stops training:
the run matters more than its telemetry. Nor does a slow API slow it: metrics go out from a
background thread, a second's points in one request (every other report sends those before it
first, then goes itself).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import math
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zeropilot.resume import ResumeMethod

# A marker line the failure classifier also finds in the log tail when the API is unreachable.
FAILURE_MARKER = "ZEROPILOT_FAILURE_CLASS="
# EX_TEMPFAIL of sysexits.h: saved and stopped on request, to be run again; not a failure.
STOPPED_EXIT_CODE = 75
# Sent with each step's metrics on a GPU: torch's max_memory_reserved (service.db.learning reads it)
RESERVED_PEAK_KEY = "memory_reserved_peak_bytes"

# Metrics points waiting for the background sender; past this (an API down for a long while)
# new ones are dropped, not the training slowed.
QUEUED_REPORTS_MAX = 10_000
FLUSH_S = 10.0  # how long the process's exit, or a report after metrics, waits for them
# Metrics leave at most one request this often: a job stepping ten times a second costs the
# API one request a second; a point after a quiet second leaves at once. A checkpoint, a
# failure or the exit sends what has gathered at once.
BATCH_S = 1.0
POINTS_PER_REQUEST = 1000  # the API's most per request (METRIC_POINTS_PER_REPORT)

_OOM_GPU_PATTERNS = ("cuda out of memory", "outofmemoryerror", "hip out of memory", "out of memory")
_OOM_HOST_PATTERNS = ("defaultcpuallocator: can't allocate", "std::bad_alloc")


@dataclass
class Reporter:
    """Sends runtime reports for one attempt; disabled (a no-op) outside zeropilot."""

    url: str | None = None
    attempt_id: str | None = None
    token: str | None = None
    timeout_s: float = 5.0
    _warned: bool = field(default=False, repr=False)
    _expired: bool = field(default=False, repr=False)  # the API said the attempt has ended
    _stop_signal: bool = field(default=False, repr=False)  # SIGTERM arrived: save, then exit
    # Metrics points for the background sender; None asks it to send what it has gathered.
    _queued: queue.Queue[dict[str, Any] | None] | None = field(default=None, repr=False)
    # Steps between saves: the launch's, then what each metrics report's answer says (with
    # checkpoint.interval_steps: auto it follows the measurements). None: not under zeropilot.
    checkpoint_interval: int | None = None
    _last_saved: int | None = field(default=None, repr=False)  # the step of the last save

    @classmethod
    def from_env(cls) -> Reporter:
        interval = os.environ.get("ZEROPILOT_CHECKPOINT_INTERVAL", "")
        return cls(
            url=os.environ.get("ZEROPILOT_URL"),
            attempt_id=os.environ.get("ZEROPILOT_ATTEMPT_ID"),
            token=os.environ.get("ZEROPILOT_ATTEMPT_TOKEN") or _token_from_file(),
            checkpoint_interval=int(interval) if interval.isdigit() and int(interval) else None,
        )

    def checkpoint_due(self, step: int, default: int = 100) -> bool:
        """Whether to save after ``step``: ``checkpoint_interval`` steps (``default`` outside
        zeropilot) since this attempt's last save or its start. Call it on every rank at the
        same point of every step: rank 0, which hears the interval, decides for all."""
        if self._last_saved is None:
            self._last_saved = step - 1  # a resumed attempt counts from where it resumed
        interval = self.checkpoint_interval or default
        return _any_rank(_rank() == 0 and step - self._last_saved >= interval)

    @property
    def enabled(self) -> bool:
        return bool(self.url and self.attempt_id and self.token) and not self._expired

    def metrics(
        self,
        step: int,
        loss: float | None = None,
        tokens_per_s: float | None = None,
        memory_peak_bytes: int | None = None,
        **extra: float,
    ) -> None:
        """Report one training step's numbers (call it from rank 0). A NaN or infinite value
        (a diverged loss) is reported as missing, with a warning, so the step still counts.
        On a GPU torch's reserved peak goes with them: an OOM happens against reserved memory,
        and the advisor learns its memory share from it."""
        reserved = _reserved_peak()
        if reserved is not None:
            extra.setdefault(RESERVED_PEAK_KEY, float(reserved))
        numbers = {"loss": loss, "tokens_per_s": tokens_per_s, **extra}
        odd = sorted(k for k, v in numbers.items() if v is not None and not math.isfinite(v))
        if odd:
            self._warn_once(f"step {step}: {', '.join(odd)} not finite, reported as missing")
        loss, tokens_per_s = (None if k in odd else numbers[k] for k in ("loss", "tokens_per_s"))
        self._post_later(
            {
                "step": step,
                "loss": loss,
                "tokens_per_s": tokens_per_s,
                "memory_peak_bytes": memory_peak_bytes,
                "extra": {k: v for k, v in extra.items() if k not in odd},
            },
        )

    def checkpoint(
        self, step: int, path: str, tag: str | None = None, seconds: float | None = None
    ) -> None:
        """Report a checkpoint that has been completely written (call it after save returns),
        with how long the save took: zeropilot sizes the grace of a stop from it."""
        self._last_saved = step
        body = {"step": step, "path": os.path.abspath(path), "tag": tag, "seconds": seconds}
        self._post("checkpoints", body)

    def failure(
        self, failure_class: str, message: str, evidence: dict[str, int] | None = None
    ) -> None:
        """Tag this attempt's failure explicitly; the classifier trusts this tag first."""
        print(f"{FAILURE_MARKER}{failure_class} {message[:200]}", file=sys.stderr, flush=True)
        text = message.replace("\x00", "")[:2000]  # NUL bytes from a binary log are refused
        payload = {"failure_class": failure_class, "message": text}
        self._post("failure", {**payload, "evidence": evidence or {}})

    def device_memory(self) -> None:
        """Record this rank's device memory (free, total, held by others) as it starts."""
        numbers = device_memory()
        free, total = numbers.pop("device_free_bytes"), numbers.pop("device_total_bytes")
        report = {"device_free_bytes": free, "device_total_bytes": total, "numbers": numbers}
        self._post("device", {"rank": _rank(), **report})

    def watch_for_stop(self) -> None:
        """Turn SIGTERM into a request to save and stop at the end of the current step (call
        it once, from the main thread, before training). zeropilot stops every attempt this
        way (a cancel, a preemption, a drain) and sends SIGKILL only after the grace period.
        SIGUSR1 prints every thread's Python stack to stderr (zeropilot asks a hung job)."""

        def on_term(_signum: int, _frame: Any) -> None:
            if not self._stop_signal:
                print("zeropilot: SIGTERM: saving at the end of this step", file=sys.stderr)
            self._stop_signal = True

        signal.signal(signal.SIGTERM, on_term)
        # zeropilot asks a hung job's ranks for their stacks: printed into this rank's log.
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def stop_requested(self) -> bool:
        """Whether to save and stop now. Call it at the same point of every step on every rank:
        the ranks agree (any rank signalled stops all), so that all of them save the same step."""
        return _any_rank(self._stop_signal)

    def stopped(self, step: int, path: str) -> None:
        """Report that training saved ``path`` at ``step`` and stops on request (rank 0, after
        the checkpoint report); then leave with ``STOPPED_EXIT_CODE`` on every rank."""
        self.failure("PREEMPTED", f"stopped on request at step {step} after saving {path}")

    @contextmanager
    def oom_guard(self) -> Iterator[None]:
        """Record the device's memory as training starts; tag allocator failures as OOM, with
        the numbers this process saw, before the exception ends the process."""
        self.device_memory()
        try:
            yield
        except (MemoryError, RuntimeError) as exc:
            self.report_oom(exc)
            raise

    def report_oom(self, exc: BaseException) -> bool:
        """Tag ``exc`` as OOM_HOST or OOM_GPU, with this process's numbers, if it is an
        allocator failure (torch.OutOfMemoryError subclasses RuntimeError); whether it was."""
        if isinstance(exc, MemoryError):
            self.failure("OOM_HOST", f"MemoryError: {exc}", host_memory())
            return True
        if not isinstance(exc, RuntimeError):
            return False
        text = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if any(p in text.lower() for p in _OOM_HOST_PATTERNS):
            self.failure("OOM_HOST", text, host_memory())
        elif any(p in text.lower() for p in _OOM_GPU_PATTERNS):
            self.failure("OOM_GPU", text, device_memory())
        else:
            return False
        return True

    def flush(self, timeout_s: float = FLUSH_S) -> None:
        """Send the metrics reported so far now, and wait (at most ``timeout_s``) until they
        have gone."""
        waiting = self._queued
        if waiting is None:
            return
        with contextlib.suppress(queue.Full):  # full: the sender is busy sending anyway
            waiting.put_nowait(None)  # no more gathering: send what has gathered
        deadline = time.monotonic() + timeout_s
        while waiting.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _post_later(self, payload: dict[str, Any]) -> None:
        """Queue a step's metrics for the background sender, started with the first."""
        if not self.enabled:
            return
        if self._queued is None:
            self._queued = queue.Queue(QUEUED_REPORTS_MAX)
            threading.Thread(
                target=self._send_queued, name="zeropilot-reports", daemon=True
            ).start()
            atexit.register(self.flush)  # the last steps' points before the process ends
        try:
            self._queued.put_nowait(payload)
        except queue.Full:
            self._warn_once(f"{QUEUED_REPORTS_MAX} reports not sent yet: dropping new ones")

    def _send_queued(self) -> None:
        """Send the points at most one request every ``BATCH_S``: a point after a quiet
        second leaves at once, those that come within the second after it leave together (a
        flush sends what has gathered without waiting)."""
        assert self._queued is not None
        last_sent = -math.inf
        while True:
            points, taken = _gather(self._queued, until=last_sent + BATCH_S)
            try:
                if points:
                    self._send("metrics/batch", points)
                    last_sent = time.monotonic()
            finally:
                for _ in range(taken):
                    self._queued.task_done()

    def _post(self, kind: str, payload: dict[str, Any]) -> None:
        """Send a report now, after the metrics queued before it (the order they happened)."""
        if not self.enabled:
            return
        self.flush()
        self._send(kind, payload)

    def _send(self, kind: str, payload: dict[str, Any] | list[dict[str, Any]]) -> None:
        if not self.enabled:  # refused with 401 since it was queued: the attempt has ended
            return
        if not str(self.url).startswith(("http://", "https://")):
            self._warn_once(f"ZEROPILOT_URL must be an http(s) URL, not {self.url!r}")
            return
        request = urllib.request.Request(  # noqa: S310 (scheme checked above)
            f"{str(self.url).rstrip('/')}/v1/runtime/attempts/{self.attempt_id}/{kind}",
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                self._learn(response.read())
        except urllib.error.HTTPError as exc:
            # 401 after the attempt ended or its job was cancelled: later reports would be too.
            self._expired = exc.code == 401
            self._warn_once(f"{kind} report refused ({exc.code}): {_detail(exc)}")
        except (urllib.error.URLError, OSError) as exc:
            self._warn_once(f"could not report {kind}: {exc}")

    def _learn(self, answer: bytes) -> None:
        """Take the interval a metrics report's answer carries (other answers carry none)."""
        try:
            steps = json.loads(answer or b"null")
        except ValueError:
            return
        steps = steps.get("checkpoint_interval_steps") if isinstance(steps, dict) else None
        if type(steps) is int and steps > 0:  # not a bool
            self.checkpoint_interval = steps

    def _warn_once(self, message: str) -> None:
        if not self._warned:  # one warning, not one per step
            print(f"zeropilot: {message}", file=sys.stderr, flush=True)
            self._warned = True


def _gather(
    waiting: queue.Queue[dict[str, Any] | None], until: float
) -> tuple[list[dict[str, Any]], int]:
    """The next batch: the next point, then those that come until ``until`` (the monotonic
    clock; if past, only those already queued) or a flush's marker; and how many queue items
    it took (the marker too)."""
    points: list[dict[str, Any]] = []
    item, taken = waiting.get(), 1
    while item is not None:
        points.append(item)
        if len(points) >= POINTS_PER_REQUEST:
            break
        left = until - time.monotonic()
        try:
            item = waiting.get(timeout=left) if left > 0 else waiting.get_nowait()
        except queue.Empty:
            break
        taken += 1
    return points, taken


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _any_rank(flag: bool) -> bool:
    """``flag`` of any rank, through one all-reduce when torch.distributed runs (a SIGTERM may
    reach the ranks between two steps); this rank's own outside a world."""
    torch = sys.modules.get("torch")  # only what the training process has imported already
    dist = getattr(torch, "distributed", None)
    if torch is None or dist is None or not dist.is_available() or not dist.is_initialized():
        return flag
    if dist.get_world_size() == 1:
        return flag
    backend = dist.get_backend()
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    votes = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return bool(votes.item())


def host_memory() -> dict[str, int]:
    """This process's memory and the limits on it: what a host OOM is measured against."""
    numbers: dict[str, int] = {}
    status = _read_kib_fields(
        "/proc/self/status",
        {"VmSize": "in_use_bytes", "VmRSS": "rss_bytes", "VmHWM": "peak_rss_bytes"},
    )
    numbers.update(status)
    limit = _address_space_limit()
    if limit is not None:
        numbers["limit_bytes"] = limit  # RLIMIT_AS: the in-use figure is the address space
    meminfo = _read_kib_fields(
        "/proc/meminfo", {"MemTotal": "total_bytes", "MemAvailable": "free_bytes"}
    )
    numbers.update(meminfo)
    if (cgroup := _cgroup_limit()) is not None:
        numbers["cgroup_limit_bytes"] = cgroup
    return numbers


def _reserved_peak() -> int | None:
    """torch's reserved high-water mark on this rank's GPU (None on CPU ranks)."""
    torch = sys.modules.get("torch")  # only what the training process has imported already
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        return None
    return int(cuda.max_memory_reserved())


def device_memory() -> dict[str, int]:
    """Free and total bytes of this rank's device; on a CPU rank the host is the device."""
    torch = sys.modules.get("torch")  # only what the training process has imported already
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        free, total = cuda.mem_get_info()
        held = int(cuda.memory_reserved())
        # What is neither free nor ours is another process's (and the driver's context)
        return {
            "device_free_bytes": int(free),
            "device_total_bytes": int(total),
            "process_bytes": held,
            "other_processes_bytes": max(total - free - held, 0),
        }
    host = host_memory()
    return {
        "device_free_bytes": host.get("free_bytes", 0),
        "device_total_bytes": host.get("total_bytes", 0),
        **{k: v for k, v in host.items() if k not in ("free_bytes", "total_bytes")},
    }


def _read_kib_fields(path: str, names: dict[str, str]) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        with open(path) as source:
            for line in source:
                key, _, value = line.partition(":")
                if key in names and value.strip().endswith("kB"):
                    found[names[key]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def _address_space_limit() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2, then v1), if one is set."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as source:
                text = source.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with a huge number
            return int(text)
    return None


def checkpoint_dir(default: str = "checkpoints") -> str:
    """Where this attempt should save checkpoints."""
    return os.environ.get("ZEROPILOT_CHECKPOINT_DIR", default)


def resume_from() -> str | None:
    """The checkpoint folder this attempt should resume from, if zeropilot chose one."""
    return os.environ.get("ZEROPILOT_RESUME_FROM") or None


@dataclass(frozen=True)
class ResumePoint:
    """Where and how this attempt resumes.

    ``method``, chosen by zeropilot from the ZeRO stages before and after:

    - ``native``: the same partitioning: ``engine.load_checkpoint(load_dir, tag=tag)``;
    - ``universal``: ZeRO-1 and 2 between them: the same call on a universal checkpoint (the
      ds_config zeropilot rendered sets ``checkpoint.load_universal``), optimizer states kept;
    - ``weights``: to ZeRO-3, or from ZeRO-0, where DeepSpeed 0.19 converts nothing: call
      ``zeropilot.resume_weights.load_weights(model, point)`` before ``deepspeed.initialize``;
      the optimizer starts afresh.
    """

    load_dir: str
    tag: str
    method: ResumeMethod

    @property
    def load_optimizer_states(self) -> bool:
        return self.method in (ResumeMethod.NATIVE, ResumeMethod.UNIVERSAL)

    @property
    def before_engine(self) -> bool:
        """The weights go into the model before ``deepspeed.initialize``, not through it."""
        return self.method == ResumeMethod.WEIGHTS


UNIVERSAL_SUFFIX = "_universal"
_CONVERTED_MARKER = ".zeropilot-converted"


def resume_point(wait_s: float = 3600.0) -> ResumePoint | None:
    """Where this attempt resumes from, converted first when the method is ``universal``.

    Call it on every rank before loading. Global rank 0 converts the checkpoint with DeepSpeed's
    ``ds_to_universal`` into ``<tag>_universal`` beside it (once: a finished conversion is marked);
    the other ranks wait for the mark, so the checkpoint folder must be shared by all nodes.
    """
    path = resume_from()
    if path is None:
        return None
    load_dir, tag = os.path.split(path.rstrip("/"))
    method = ResumeMethod(os.environ.get("ZEROPILOT_RESUME_METHOD", ResumeMethod.NATIVE))
    if method != ResumeMethod.UNIVERSAL:
        return ResumePoint(load_dir, tag, method)
    universal = os.path.join(load_dir, tag + UNIVERSAL_SUFFIX)
    if os.environ.get("RANK", "0") == "0":
        convert_to_universal(os.path.join(load_dir, tag), universal)
    else:
        _wait_for(os.path.join(universal, _CONVERTED_MARKER), wait_s)
    return ResumePoint(load_dir, tag + UNIVERSAL_SUFFIX, method)


def convert_to_universal(source: str, target: str) -> None:
    """DeepSpeed's ``ds_to_universal`` from ``source`` into ``target``; a no-op when done."""
    marker = os.path.join(target, _CONVERTED_MARKER)
    if os.path.exists(marker):
        return
    if os.path.isdir(target):  # a conversion that died midway: start over
        shutil.rmtree(target)
    command = [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", source, "--output_folder", target,
        "--inject_missing_state",  # the universal info Megatron records; plain models lack it
    ]  # fmt: skip
    print(f"zeropilot: converting {source} to a universal checkpoint", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"ds_to_universal failed ({done.returncode}) on {source}:\n{done.stderr[-4000:]}"
        )
    with open(marker, "w") as out:
        out.write(source + "\n")


def _wait_for(path: str, wait_s: float) -> None:
    give_up = time.monotonic() + wait_s
    while not os.path.exists(path):
        if time.monotonic() > give_up:
            raise TimeoutError(f"no {path} after {wait_s:.0f} s: is the checkpoint folder shared?")
        time.sleep(2.0)


def _detail(error: urllib.error.HTTPError) -> str:
    """The API's reason for a refusal (its ``detail``), or the status line."""
    try:
        detail = json.loads(error.read() or b"{}").get("detail", error.reason)
    except (OSError, ValueError, AttributeError):
        detail = error.reason
    return str(detail)[:500]


def _token_from_file() -> str | None:
    """On Kubernetes the token is a file from the attempt's Secret, not an env value."""
    path = os.environ.get("ZEROPILOT_ATTEMPT_TOKEN_FILE")
    try:
        return (Path(path).read_text().strip() or None) if path else None
    except OSError:
        return None
