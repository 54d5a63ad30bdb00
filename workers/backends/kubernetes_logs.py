"""Each pod's log on the shared volume, where the API reads logs (as it reads Slurm's).

With a ``shared_volume_claim`` and the attempt folder on that volume, a pod's command is the
launcher under a small Python program (``TEE``, run by the image's interpreter, which the
launcher needs anyway): it copies the launcher's output both to the container's stdout (the pod
log, and the termination message ``FallbackToLogsOnError`` takes from it) and to
``<attempt folder>/node-<index>.log``; it passes SIGTERM, SIGINT and SIGUSR1 on to the launcher
(the graceful stop, the time limit's warning) and exits with the launcher's code (128 + the
signal that killed it). A pod that cannot write the file says so on stderr and runs on.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from workers.backends.base import LaunchRequest

NODE_LOG = "node-{index}.log"
TEE = """\
import os, signal, subprocess, sys
path = sys.argv[1]
try:
    log = open(path, "ab", buffering=0)
except OSError as exc:
    print(f"zeropilot: not writing this node's log to {path}: {exc}", file=sys.stderr, flush=True)
    log = None
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(number, lambda received, _frame: child.send_signal(received))
while chunk := os.read(child.stdout.fileno(), 65536):
    os.write(1, chunk)
    if log is not None:
        try:
            log.write(chunk)
        except OSError as exc:
            print(f"zeropilot: stopped writing {path}: {exc}", file=sys.stderr, flush=True)
            log = None
code = child.wait()
sys.exit(128 - code if code < 0 else code)
"""


def node_log_on_volume(request: LaunchRequest) -> PurePosixPath | None:
    """Where the pods write their logs, ``{index}`` for the node: None when they cannot (no
    shared volume, or the attempt folder is not on it)."""
    profile = request.profile
    if profile.shared_volume_claim is None:
        return None
    folder = PurePosixPath(Path(request.attempt_dir).absolute())
    if not folder.is_relative_to(PurePosixPath(profile.shared_volume_path)):
        return None
    return folder / NODE_LOG
