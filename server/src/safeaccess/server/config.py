"""Server configuration and the layout of the data directory.

One data directory holds everything the embedded deployment needs:

    config.yaml         this file's `ServerConfig` (YAML)
    server_key.pem      the server's Ed25519 signing key (mode 0600)
    safeaccess.db       SQLite database (unless `database_url` points at PostgreSQL)
    datasets/NAME/vN.parquet, vN.rules.yaml
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from safeaccess.client.analyses import SYNTH_MAX_EPSILON
from safeaccess.sandbox.config import SandboxConfig
from safeaccess.server.errors import ConfigError

ENV_DATA_DIR = "SAFEACCESS_DATA"
DEFAULT_DATA_DIR = "safeaccess-data"
CONFIG_FILE = "config.yaml"
KEY_FILE = "server_key.pem"
DB_FILE = "safeaccess.db"


class ReviewWebConfig(BaseModel):
    """The output checkers' web workspace under /review."""

    model_config = ConfigDict(extra="forbid")

    idle_timeout_seconds: int = Field(
        default=15 * 60, ge=1, le=24 * 3600, description="A session ends after this long idle."
    )
    session_lifetime_seconds: int = Field(
        default=8 * 3600, ge=60, le=7 * 24 * 3600, description="...and this long after login."
    )
    login_failures_per_account: int = Field(default=5, ge=1, le=1000)
    login_failures_per_address: int = Field(default=20, ge=1, le=10000)
    login_window_seconds: int = Field(
        default=15 * 60, ge=1, le=24 * 3600, description="Window of the login failure limits."
    )


class QueueConfig(BaseModel):
    """The job queue (execution = "queue"): how API replicas and worker hosts share steps."""

    model_config = ConfigDict(extra="forbid")

    wait_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="How long a reveal waits for its step's job before answering 'running' (the "
        "client then asks again).",
    )
    lease_seconds: float = Field(
        default=30.0,
        ge=2,
        le=3600,
        description="A worker that sent no heartbeat for this long is presumed dead: its table "
        "jobs are queued again (at most max_attempts in all), its script jobs fail as crashed.",
    )
    max_attempts: int = Field(default=3, ge=1, le=10)
    keep_jobs_hours: int = Field(
        default=168,
        ge=1,
        le=24 * 366,
        description="Finished jobs (the queue's working rows, not the record of a step: that is "
        "the audit log) are deleted by the workers this many hours after they finished.",
    )
    affinity_seconds: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description="A worker claims a waiting step on a dataset it holds warm (its sandbox "
        "templates loaded) before an older step on another dataset of the same priority, unless "
        "that one has waited this long. Fairness between researchers comes first. 0: oldest "
        "first, as procrastinate.",
    )
    pools: dict[str, str] = Field(
        default_factory=dict,
        description="Dataset name -> pool: the dataset's steps go to queue 'steps.<pool>', served "
        "by the workers started with `--queues steps.<pool>` (who keep its templates warm). "
        "Datasets not named go to 'steps'.",
    )


class TimingConfig(BaseModel):
    """Reply padding (`steps/timing.py`): how long a step takes to answer is set by the analysis
    and the published metadata, not by the records."""

    model_config = ConfigDict(extra="forbid")

    pad: bool = Field(
        default=False,
        description="Record (and so answer) each computed step no earlier than its deadline: "
        "base_seconds + seconds_per_million_records x the version's published row count. A step "
        "that takes longer is recorded at the deadline times the next power of two. Costs "
        "latency, and holds the step's query-set scope until then.",
    )
    base_seconds: float = Field(default=1.0, gt=0, le=600)
    seconds_per_million_records: float = Field(default=1.0, ge=0, le=600)


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server_id: str = Field(
        pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
        description="This centre's id; sequence headers must name it.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://...; default: SQLite in the data dir.",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    max_concurrent_jobs: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Sandbox jobs run at once; further steps wait (bounds memory: each job may "
        "use sandbox.limits.memory_mb).",
    )
    max_jobs_per_researcher: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Sandbox jobs one researcher may have running at once (in each queue); the "
        "others' jobs take free slots first (fair queue).",
    )
    max_concurrent_scripts: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Script runs at once. Scripts run in the background in a queue of their own, "
        "so they never delay a researcher's answer (their duration is not hers to observe).",
    )
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    clock_skew_seconds: int = Field(default=300, ge=5, le=3600)
    trusted_cas: dict[str, str] = Field(
        default_factory=dict,
        description="CA name -> PEM file (relative to the data dir) of a certification authority "
        "whose endorsements this centre accepts.",
    )
    review_web: ReviewWebConfig = Field(default_factory=ReviewWebConfig)
    execution: Literal["local", "queue"] = Field(
        default="local",
        description="'local': this process runs the steps (one host; the embedded default). "
        "'queue': steps become jobs in PostgreSQL's job queue, run by `safeaccess-server worker` "
        "hosts, so any number of API replicas can serve (needs database_url on PostgreSQL).",
    )
    queue: QueueConfig = Field(default_factory=QueueConfig)
    timing: TimingConfig = Field(default_factory=TimingConfig)
    reserve_standard_tables: bool = Field(
        default=True,
        description="Admit each declared categorical column's one- and two-way frequency tables "
        "(as suppression releases them: cells below the threshold and, so that no total gives "
        "them away, secondary cells left out) into every shared query-set scope ('project' or "
        "'dataset', span mode) right after its population (docs/qss.md, 'Standard tables "
        "reserved'): a release that conflicts with a colleague's standard table is then the "
        "refused one, and the colleague's table stays released. On by default; false restores "
        "first come, first served. Never in a researcher's own scope, where no colleague's "
        "release can refuse her tables.",
    )

    @model_validator(mode="after")
    def _queue_needs_postgresql(self) -> ServerConfig:
        if self.execution == "queue" and not (self.database_url or "").startswith("postgresql"):
            raise ValueError(
                "execution = 'queue' needs the job queue's database: set database_url to a "
                "PostgreSQL URL (postgresql+psycopg://...), or use execution = 'local'"
            )
        return self


def default_data_dir() -> Path:
    """$SAFEACCESS_DATA, else ./safeaccess-data."""
    return Path(os.environ.get(ENV_DATA_DIR) or DEFAULT_DATA_DIR)


class DataDir:
    """Paths inside one data directory."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def key_path(self) -> Path:
        return self.root / KEY_FILE

    @property
    def datasets(self) -> Path:
        return self.root / "datasets"

    def database_url(self, config: ServerConfig) -> str:
        return config.database_url or f"sqlite:///{(self.root / DB_FILE).resolve()}"

    def load_config(self) -> ServerConfig:
        """Read config.yaml, or raise ConfigError saying how to create it."""
        if not self.config_path.is_file():
            raise ConfigError(
                f"{self.config_path} does not exist; run 'safeaccess-server init --data-dir "
                f"{self.root}' first"
            )
        return read_config(self.config_path)

    def save_config(self, config: ServerConfig) -> None:
        text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
        self.config_path.write_text(text, encoding="utf-8")

    def load_signing_key(self) -> Ed25519PrivateKey:
        """The server's Ed25519 key; refuses a key file others can read."""
        path = self.key_path
        if not path.is_file():
            raise ConfigError(f"{path} is missing; run 'safeaccess-server init' to create it")
        if path.stat().st_mode & 0o077:
            raise ConfigError(f"{path} is readable by others; run 'chmod 600 {path}'")
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path} is not an Ed25519 private key")
        return key


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"configuration {path} must be a YAML mapping")
    return raw


def read_config(path: Path) -> ServerConfig:
    """Read and validate a configuration file, or raise ConfigError saying what is wrong."""
    try:
        return ServerConfig.model_validate(_read_mapping(path))
    except ValidationError as exc:
        raise ConfigError(f"{path} is not a valid configuration: {exc}") from exc


def set_sandbox_image(path: Path, image_id: str) -> None:
    """Set `sandbox.docker.image` in the configuration at `path`, atomically, changing nothing else.

    The result is validated as a server configuration before it replaces the file, so a bad file
    is left untouched; the file keeps its mode.
    """
    raw = _read_mapping(path)
    sandbox = raw.setdefault("sandbox", {})
    if not isinstance(sandbox, dict):
        raise ConfigError(f"'sandbox' in {path} must be a mapping")
    docker_section = sandbox.setdefault("docker", {})
    if not isinstance(docker_section, dict):
        raise ConfigError(f"'sandbox.docker' in {path} must be a mapping")
    docker_section["image"] = image_id
    try:
        ServerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"configuration {path} would not be valid: {exc}") from exc
    mode = path.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            yaml.safe_dump(raw, out, sort_keys=False)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def initialise(
    root: Path, *, server_id: str | None = None, database_url: str | None = None
) -> ServerConfig:
    """Create a data directory with a fresh config and signing key; refuse to overwrite one.

    `database_url` (SQLAlchemy, e.g. PostgreSQL) goes into the config; None keeps SQLite in the
    data directory. A malformed URL is refused before anything is created.
    """
    data = DataDir(root)
    if database_url is not None:
        # Here, not at the top: the store's modules read this one's settings.
        from safeaccess.server.store.urls import is_database_url

        if not is_database_url(database_url):
            raise ConfigError(
                f"--database-url {database_url!r} is not a database URL (e.g. "
                "postgresql+psycopg://user@host/safeaccess)"
            )
    if data.config_path.exists() or data.key_path.exists():
        raise ConfigError(f"{root} is already initialised; choose another --data-dir")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    data.datasets.mkdir(exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Create with 0600 from the start so the key is never briefly world-readable.
    fd = os.open(data.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    config = ServerConfig(
        server_id=server_id or f"sac-{secrets.token_hex(6)}", database_url=database_url
    )
    data.save_config(config)
    return config


# -- the per-dataset settings a controller sets ---------------------------------------------------

Scope = Literal["researcher", "project", "dataset"]


class QssSettings(BaseModel):
    """How a dataset's releases are audited across outputs: the query-set auditor's settings.

    Set per dataset name (so they span its versions) when its first version is registered:
    `mode` is `span` (default; refuse what would *determine* an aggregate over fewer than k
    records) or `atoms` (refuse, besides that, what would create a non-empty atom of fewer than
    k records);
    `scope` says whose releases are audited together: `researcher`, `project` (default:
    colleagues in one project share a state, so they cannot collude) or `dataset` (everyone);
    an output that would split the partition into more than `atom_cap` atoms is refused for
    cost, under that name (span mode never switches to another rule). k is the threshold of the
    dataset's rule set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["span", "atoms"] = "span"
    scope: Scope = "project"
    atom_cap: int = Field(default=2_000_000, ge=1)


DEFAULT_QSS = QssSettings()


def scope_key(dataset: str, scope: Scope, *, researcher: str, project: str) -> str:
    """The name of the auditor state a step is admitted against (one per scope, all versions)."""
    if scope == "researcher":
        return f"{dataset}/researcher/{researcher}"
    if scope == "project":
        return f"{dataset}/project/{project}"
    return f"{dataset}/dataset"


def scope_folder(key: str) -> str:
    """A file-system-safe folder name for a scope's state files."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


class DPConfig(BaseModel):
    """A dataset's differential-privacy configuration, as the controller sets it.

    `epsilon`/`delta` is the total budget of one ledger; `scope` says whose releases share a
    ledger (each researcher, each project, or everyone on the dataset); `mandatory` refuses
    rule-checked kinds on the dataset; `max_tpr_at_5pct` caps what one release may give an
    attacker telling neighbouring datasets apart (its TPR at FPR 0.05).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # up to the largest synthetic-data request, so that a budget can cover it (the bound only
    # catches typos; each kind's own request bound still applies)
    epsilon: float = Field(gt=0.0, le=SYNTH_MAX_EPSILON, allow_inf_nan=False)
    delta: float = Field(gt=0.0, lt=1.0)
    scope: Scope = "researcher"
    mandatory: bool = False
    max_tpr_at_5pct: float | None = Field(
        default=None,
        gt=0.05,
        le=1.0,
        description="Largest TPR at FPR 0.05 one release may allow (above 0.05, which is "
        "blind guessing).",
    )


def ledger_key(dataset: str, scope: Scope, *, researcher: str, project: str) -> tuple[str, str]:
    """(ledger key, owner) of the scope a step of `researcher` in `project` is charged to."""
    owner = {"researcher": researcher, "project": project, "dataset": dataset}[scope]
    return f"{dataset}|{scope}|{owner}", owner
