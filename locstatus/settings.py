"""Settings from the environment (``LOCSTATUS_*``), with pydantic-settings.

``LOCSTATUS_BACKEND`` picks the backend URL (default ``sqlite:///./locstatus.db``),
``LOCSTATUS_SERVICES`` the comma-separated service set, ``LOCSTATUS_API_TOKEN`` the sidecar's
bearer token, ``LOCSTATUS_LEASE_SECONDS`` the worker lease length,
``LOCSTATUS_CLOCK_PROBE_INTERVAL`` and ``LOCSTATUS_CLOCK_MAX_UNCERTAINTY`` how the backend's
time is measured (docs/time.md).
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from locstatus.backend_clock import DEFAULT_MAX_UNCERTAINTY, DEFAULT_PROBE_INTERVAL
from locstatus.names import DEFAULT_SERVICES, SERVICE_RE


class Settings(BaseSettings):
    """Process settings; every field can be set as ``LOCSTATUS_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="LOCSTATUS_", extra="ignore")

    backend: str = "sqlite:///./locstatus.db"
    """Backend URL (docs/design.md §4)."""
    services: str = ",".join(DEFAULT_SERVICES)
    """Comma-separated set of service names."""
    api_token: SecretStr | None = None
    """Bearer token required by the sidecar's mutating routes when set."""
    api_tokens_file: str | None = None
    """Path of the sidecar's tokens file: named callers and roles, stored as hashes
    (docs/http.md "Callers and roles"); reloaded on SIGHUP."""
    zk_auth: SecretStr | None = None
    """ZooKeeper digest credentials ``user:password`` (or give them in the zk:// URL)."""
    lease_seconds: float = Field(default=10.0, gt=0.5, le=3600)
    """Worker lease length in seconds (heartbeat backends renew at a third of it)."""
    clock_probe_interval: float = Field(default=DEFAULT_PROBE_INTERVAL, ge=0.1, le=3600)
    """Seconds between two reads of the backend's time (docs/time.md "Reading the backend's
    time"); a decision that needs a tighter bound reads it sooner."""
    clock_max_uncertainty: float = Field(default=DEFAULT_MAX_UNCERTAINTY, gt=0, le=60)
    """Seconds: when this process cannot tell the backend's time within this bound it acts on
    no deadline (settles without no worker, fires no resume; docs/time.md)."""

    @field_validator("services")
    @classmethod
    def _check_services(cls, value: str) -> str:
        names = [s.strip() for s in value.split(",") if s.strip()]
        bad = [s for s in names if not SERVICE_RE.fullmatch(s)]
        if not names or bad:
            raise ValueError(f"invalid LOCSTATUS_SERVICES {value!r}")
        return ",".join(names)

    @property
    def service_list(self) -> tuple[str, ...]:
        return tuple(self.services.split(","))
