"""Each pod's log on the shared volume, where the API reads logs (as it reads Slurm's).

With a ``shared_volume_claim`` and the attempt folder on that volume, a pod's command is the
launcher under a small Python program (``TEE``, run by the image's interpreter, which the
launcher needs anyway): it copies the launcher's output both to the container's stdout (the pod
log, and the termination message ``FallbackToLogsOnError`` takes from it) and to
``<attempt folder>/node-<index>.log``; it passes SIGTERM, SIGINT and SIGUSR1 (the graceful
stop, the time limit's warning) on to the training ranks, the processes below the launcher's
two levels (DeepSpeed's ``runner`` and its ``launch.py``), or to the launcher while no rank has
started yet; and it exits with the launcher's code (128 + the signal that killed it). Not to the
launcher itself: the runner has no handler and dies of SIGTERM, leaving ``launch.py`` and the
ranks running untold, and ``launch.py`` would exit 1 and kill its ranks 30 s later whatever the
grace. Told directly, the ranks save and exit 75, and ``launch.py`` and the runner exit with
that. A pod that cannot write the file says so on stderr and runs on. Without the volume the
same program runs with no file (an empty path): the launcher is never the container's first
process, which would ignore SIGTERM (it installs no handler) and so never tell the ranks.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from workers.backends.base import LaunchRequest

NODE_LOG = "node-{index}.log"
TEE = """\
import os, signal, subprocess, sys
path, log = sys.argv[1], None
try:
    log = open(path, "ab", buffering=0) if path else None
except OSError as exc:
    print(f"zeropilot: not writing this node's log to {path}: {exc}", file=sys.stderr, flush=True)
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
def children(of):
    found = set()
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) in of:
                    found.add(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return found
def tell(received, _frame):
    launch = children({child.pid})  # the runner's launch.py; its children are the ranks
    for pid in children(launch) or launch or {child.pid}:
        try:
            os.kill(pid, received)
        except ProcessLookupError:
            pass
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(number, tell)
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
