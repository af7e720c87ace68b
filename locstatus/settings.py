"""Settings from the environment (``LOCSTATUS_*``), with pydantic-settings.

``LOCSTATUS_BACKEND`` picks the backend URL (default ``sqlite:///./locstatus.db``),
``LOCSTATUS_SERVICES`` the comma-separated service set, ``LOCSTATUS_API_TOKEN`` the sidecar's
bearer token, ``LOCSTATUS_LEASE_SECONDS`` the worker lease length.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from locstatus.names import DEFAULT_SERVICES, SERVICE_RE


class Settings(BaseSettings):
    """Process settings; every field can be set as ``LOCSTATUS_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="LOCSTATUS_", extra="ignore")

    backend: str = "sqlite:///./locstatus.db"
    """Backend URL (SPEC §4)."""
    services: str = ",".join(DEFAULT_SERVICES)
    """Comma-separated set of service names."""
    api_token: SecretStr | None = None
    """Bearer token required by the sidecar's mutating routes when set."""
    zk_auth: SecretStr | None = None
    """ZooKeeper digest credentials ``user:password`` (or give them in the zk:// URL)."""
    lease_seconds: float = Field(default=10.0, gt=0.5, le=3600)
    """Worker lease length in seconds (heartbeat backends renew at a third of it)."""

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
