"""All configuration in one pydantic-settings object (env prefix ZEROPILOT_, nested with __).

The embedded defaults need nothing but this machine: SQLite under the data folder, a broker
kept in SQLite too (kombu's SQLAlchemy transport), the ``local`` backend. Production points
``ZEROPILOT_DB__URL`` at PostgreSQL and ``ZEROPILOT_BROKER__URL`` at Redis.
"""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.backfill import Margin
from service.core.clusters import LOCAL_PROFILE, ClusterProfile
from service.core.preemption import DEFAULT_MIN_RUNTIME_S
from service.core.stopping import DEFAULT_GRACE_S, MAX_GRACE_S
from service.core.waiting_placement import Hysteresis


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "zeropilot"


class DatabaseSettings(BaseModel):
    url: str | None = None  # default: sqlite file in the data folder
    echo: bool = False


class BrokerSettings(BaseModel):
    url: str | None = None  # default: sqla+sqlite broker file in the data folder


class AuthSettings(BaseModel):
    # Signs per-attempt runtime tokens; default: a random key kept in the data folder.
    secret_key: SecretStr | None = None


class WorkerSettings(BaseModel):
    reconcile_interval_s: float = Field(default=3.0, gt=0)
    # A job left QUEUED/LAUNCHING this long without progress gets its launch task sent again.
    launch_lease_s: float = Field(default=30.0, gt=0)
    # A stopped job's grace before SIGKILL when it has neither checkpoint.grace_s nor a measured
    # save (service.core.stopping sizes it from those).
    stop_grace_s: float = Field(default=DEFAULT_GRACE_S, ge=1, le=MAX_GRACE_S)
    # A launch that keeps failing (cluster unreachable, disk error) ends the attempt as
    # LAUNCH_ERROR after this many tries; the waits between them double from the first delay
    # and never exceed the lease (after which the sweep would send the launch again anyway).
    launch_max_tries: int = Field(default=3, ge=1, le=100)
    launch_retry_delay_s: float = Field(default=5.0, gt=0)
    # How often a reconcile pass reads a Kubernetes namespace's GPU quota, which bounds what
    # admission starts there (workers.cluster_bounds).
    cluster_bound_interval_s: float = Field(default=30.0, gt=0)
    # The advisor's learning (workers.learning): how often ended attempts become observations,
    # and how many new ones on a cluster refit its calibration (docs/advisor.md).
    learn_interval_s: float = Field(default=30.0, gt=0)
    refit_after: int = Field(default=5, ge=1)
    # How often a reconcile pass looks for hung attempts (workers.health).
    health_interval_s: float = Field(default=10.0, gt=0)
    python: str | None = None  # interpreter for local/slurm launches; default: this one
    # Serve this process's (and its pool's) Prometheus metrics on this port; None: not served.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # Crash-safety testing: sleep at these points of a launch so a test can kill the worker there.
    fault_pause_before_submit_s: float = 0.0
    fault_pause_after_submit_s: float = 0.0


class ClusterSettings(BaseModel):
    profiles_file: Path | None = None
    default: str = "local"


class ApiSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8321
    # The address training processes use to report back; default http://host:port.
    public_url: str | None = None
    # Larger request bodies get 413 (a spec with an inlined config.json is a few KiB).
    max_request_bytes: int = Field(default=2**20, ge=1024)
    # A request still unanswered after this gets 504.
    request_deadline_s: float = Field(default=30.0, gt=0)
    # A request's line and headers together, and its header count: past either, 431.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_header_count: int = Field(default=100, ge=1)
    # A connection whose request head is not complete this long after it opened (or after the
    # first byte of its next request) gets 408 and is closed: slow clients cannot hold it.
    header_timeout_s: float = Field(default=10.0, gt=0)
    # Open connections per API process (lowered to fit the open-file limit); one more: 503.
    max_connections: int = Field(default=1000, ge=1)


class SchedulingSettings(BaseModel):
    """Sharing (docs/scheduling.md): off by default, quotas are walls as they always were."""

    borrowing: bool = False  # a team past its quota may run on GPUs no one else uses now
    preemption: bool = False  # a waiting job may stop running ones (graceful: they save first)
    min_runtime_s: float = Field(default=DEFAULT_MIN_RUNTIME_S, ge=0)  # never a victim before
    preempt_across_teams: bool = False  # priority also stops other teams' jobs within quota
    # A waiting cluster-auto job moves where it ends clearly earlier (the margins and why:
    # service.core.waiting_placement); each pass looks at this many, in admission order.
    replace_min_gain: float = Field(default=0.20, ge=0)
    replace_min_gain_s: float = Field(default=600.0, ge=0)
    replace_settle_s: float = Field(default=900.0, ge=0)
    replace_per_pass: int = Field(default=16, ge=0)  # 0: never re-place a waiting job
    # A job behind one blocked by its cluster's cap may start when it ends before that job's
    # reserved start by a margin: this share of its predicted run, at least the floor
    # (service.core.backfill; docs/scheduling.md says why these).
    backfill: bool = False
    backfill_margin_s: float = Field(default=60.0, ge=0)
    backfill_margin_share: float = Field(default=0.25, ge=0)

    @property
    def hysteresis(self) -> Hysteresis:
        return Hysteresis(self.replace_min_gain, self.replace_min_gain_s, self.replace_settle_s)

    @property
    def backfill_margin(self) -> Margin | None:
        """The backfill's margin, None when backfill is off."""
        if not self.backfill:
            return None
        return Margin(self.backfill_margin_s, self.backfill_margin_share)

    @property
    def borrow_backoff_s(self) -> float:
        """How long a job waits after its first preemption before it borrows again (doubling
        with each one after): the minimum runtime, where preemption is on."""
        return self.min_runtime_s if self.preemption else 0.0


class LogSettings(BaseModel):
    format: Literal["text", "json"] = "text"  # json: one object per line, with request/job ids
    level: str = "INFO"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ZEROPILOT_", env_nested_delimiter="__")

    data_dir: Path = Field(default_factory=_default_data_dir)
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    workers: WorkerSettings = Field(default_factory=WorkerSettings)
    clusters: ClusterSettings = Field(default_factory=ClusterSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)

    @property
    def database_url(self) -> str:
        return self.db.url or f"sqlite:///{self.data_dir / 'zeropilot.db'}"

    @property
    def broker_url(self) -> str:
        return self.broker.url or f"sqla+sqlite:///{self.data_dir / 'broker.db'}"

    @property
    def public_url(self) -> str:
        return self.api.public_url or f"http://{self.api.host}:{self.api.port}"

    @property
    def attempts_dir(self) -> Path:
        return self.data_dir / "attempts"

    def secret_key(self) -> bytes:
        """The runtime-token signing key; created once in the data folder when not configured."""
        if self.auth.secret_key is not None:
            return self.auth.secret_key.get_secret_value().encode()
        path = self.data_dir / "secret.key"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            draft = path.with_name(f".secret.key.{os.getpid()}")
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
            try:  # link is atomic and refuses to replace: the first process to start wins
                os.link(draft, path)
            except FileExistsError:
                pass
            finally:
                draft.unlink()
        return path.read_text().strip().encode()

    def cluster_profiles(self) -> dict[str, ClusterProfile]:
        profiles = {LOCAL_PROFILE.name: LOCAL_PROFILE}
        if self.clusters.profiles_file is not None:
            for profile in _profiles_in(self.clusters.profiles_file.read_text()):
                profiles[profile.name] = profile
        return profiles


@lru_cache(maxsize=4)
def _profiles_in(text: str) -> tuple[ClusterProfile, ...]:
    """The clusters of a profiles file, parsed once per content: every submit asks, and an
    edited file takes effect at the next request."""
    raw = yaml.safe_load(text) or {}
    return tuple(ClusterProfile.model_validate(item) for item in raw.get("clusters", []))


@lru_cache
def get_settings() -> Settings:
    return Settings()
