"""Named callers of the sidecar (docs/http.md, "Callers and roles"): bearer tokens, each naming a
principal and a role, so every change made over HTTP says who made it.

Why it is shaped so:

- **Roles** are few and fixed: ``read`` (GET only), ``worker`` (register, watch and acknowledge
  as itself: its name, or the worker ids its entry lists), ``operator`` (pause, resume,
  schedule, cancel; also the worker routes, for any worker id), ``admin`` (everything an
  operator may, and the administrative routes to come: check ``--repair``, purge).
- **Stored as hashes.** The tokens file (``LOCSTATUS_API_TOKENS_FILE``, JSON) holds the SHA-256
  of each token, never the token: a token is a random secret of at least
  :data:`MIN_TOKEN_LENGTH` characters (``locstatus tokens new NAME ROLE`` makes one), so a
  plain hash is as good as a slow one and costs a microsecond per request.
  A presented token is hashed and compared with *every* entry with
  :func:`hmac.compare_digest`, whatever matched, so the time taken says nothing about which
  entry, or how much of one, matched. Tokens never reach a log or an answer: only principal
  names do.
- **Reloaded on SIGHUP** (``serve`` installs the handler): a file that does not read keeps the
  previous set in force and logs why, so a typo never locks every caller out.
- The single ``LOCSTATUS_API_TOKEN`` keeps working as one ``operator`` principal named
  ``operator`` that may name an ``actor`` (callers of that token always could).
- **The actor** of a change defaults to the principal's name; a body's ``actor`` is accepted
  only from a principal whose entry says ``"forward_actor": true`` (a proxy forwarding its
  user's name), else it is a 403.

Usage::

    principals = Principals.from_settings(tokens_file="tokens.json", token=None)
    who = principals.authenticate("the-presented-token")   # Principal or None
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import logging
import secrets
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials

from locstatus.errors import InvalidInput, Unauthorized
from locstatus.names import check_location

from .problems import ProblemError

__all__ = [
    "MIN_TOKEN_LENGTH",
    "Principal",
    "Principals",
    "Role",
    "actor_for",
    "check_secret",
    "hash_token",
    "new_token",
    "require",
]

log = logging.getLogger("locstatus.api")
RELOAD_TIMEOUT = 5.0
"""Seconds a reload waits for the tokens file to be read."""

MIN_TOKEN_LENGTH = 16
"""Shortest token accepted, in characters (a short token is guessable, and one of a few
characters would be redacted out of every log line that happens to contain it)."""


class Role(StrEnum):
    READ = "read"
    WORKER = "worker"
    OPERATOR = "operator"
    ADMIN = "admin"


_MAY = {
    Role.READ: frozenset({"read"}),
    Role.WORKER: frozenset({"read", "worker"}),
    Role.OPERATOR: frozenset({"read", "worker", "operate"}),
    Role.ADMIN: frozenset({"read", "worker", "operate", "admin"}),
}
"""What each role may do: ``read`` GET routes, ``worker`` the worker routes (a worker role as
itself only), ``operate`` the operator's mutations, ``admin`` administrative routes."""


@dataclass(frozen=True)
class Principal:
    """A named caller. ``workers``: worker ids (``fnmatch`` patterns) a ``worker`` principal may
    act as (default: its own name); ``forward_actor``: may name another ``actor``;
    ``max_streams``: watch streams it may hold at once over all its workers (None: the
    sidecar's default, docs/http.md "Limits")."""

    name: str
    role: Role
    forward_actor: bool = False
    workers: tuple[str, ...] = ()
    max_streams: int | None = None

    def may(self, action: str) -> bool:
        """``action``: ``read``, ``worker``, ``operate`` or ``admin``."""
        return action in _MAY[self.role]

    def may_act_as(self, worker_id: str) -> bool:
        """True if this principal may register, watch and acknowledge as ``worker_id``."""
        if not self.may("worker"):
            return False
        if self.role is not Role.WORKER:
            return True
        patterns = self.workers or (self.name,)
        return any(fnmatch.fnmatchcase(worker_id, p) for p in patterns)


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    principal: Principal


def hash_token(token: str) -> str:
    """The hex SHA-256 of ``token`` as the tokens file stores it."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_secret(token: str, what: str) -> str:
    """Refuse a token no client can send (surrounding whitespace, a character outside visible
    ASCII) or too short to be a secret; the message never shows it. Raises
    :class:`InvalidInput`."""
    if token != token.strip():
        raise InvalidInput(
            f"{what} has leading or trailing whitespace: no client can send it (HTTP strips "
            "it from the header); remove it"
        )
    for i, char in enumerate(token):
        if not " " <= char <= "~":
            kind = "a non-ASCII" if ord(char) > 0x7F else "a control"
            raise InvalidInput(
                f"{what} has {kind} character at position {i}: a bearer token is sent in an "
                "HTTP header and must be visible ASCII (letters, digits and punctuation such "
                "as - . _ ~ + /)"
            )
    if len(token) < MIN_TOKEN_LENGTH:
        raise InvalidInput(
            f"{what} is {len(token)} character(s) long: a token must have at least "
            f"{MIN_TOKEN_LENGTH}: set a longer one (python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'), or give the caller an entry of the tokens file "
            "(LOCSTATUS_API_TOKENS_FILE; locstatus tokens new NAME ROLE prints a token and its "
            "entry; docs/http.md, \"Callers and roles\")"
        )
    return token


def _parse(text: str, source: str) -> list[_Entry]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{source}: not JSON: {exc.msg} (line {exc.lineno})") from None
    items = doc.get("principals") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise InvalidInput(f'{source}: expected {{"principals": [...]}}')
    out: list[_Entry] = []
    names: set[str] = set()
    digests: set[str] = set()
    for i, item in enumerate(items):
        where = f"{source}: principals[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where}: expected an object")
        unknown = set(item) - {
            "name", "role", "sha256", "forward_actor", "workers", "max_streams"
        }
        if unknown:
            raise InvalidInput(f"{where}: unknown member(s) {sorted(unknown)}")
        name, role, digest = item.get("name"), item.get("role"), item.get("sha256")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{where}: 'name' must be a non-empty string")
        try:
            check_location(name)  # the principal names workers and actors: same rules
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: 'name': {exc.message}") from None
        if name in names:
            raise InvalidInput(f"{where}: the name {name!r} is used twice")
        if role not in {r.value for r in Role}:
            raise InvalidInput(
                f"{where} ({name}): 'role' must be one of {[r.value for r in Role]}"
            )
        if not isinstance(digest, str) or len(digest) != 64 or any(
            c not in "0123456789abcdef" for c in digest
        ):
            raise InvalidInput(
                f"{where} ({name}): 'sha256' must be the 64 lower-case hex digits of the "
                "token's SHA-256 (locstatus tokens hash < token-file)"
            )
        if digest in digests:
            raise InvalidInput(f"{where} ({name}): the same token is given twice")
        forward = item.get("forward_actor", False)
        if not isinstance(forward, bool):
            raise InvalidInput(f"{where} ({name}): 'forward_actor' must be true or false")
        workers = item.get("workers", [])
        if not isinstance(workers, list) or not all(isinstance(w, str) and w for w in workers):
            raise InvalidInput(f"{where} ({name}): 'workers' must be a list of worker ids")
        cap = item.get("max_streams")
        if cap is not None and (type(cap) is not int or cap < 1):
            raise InvalidInput(f"{where} ({name}): 'max_streams' must be a positive integer")
        names.add(name)
        digests.add(digest)
        who = Principal(name, Role(role), forward, tuple(workers), cap)
        out.append(_Entry(bytes.fromhex(digest), who))
    return out


@dataclass
class Principals:
    """The callers a sidecar knows. ``enabled`` is false when there is no token at all (the
    sidecar then trusts whoever reaches it, docs/http.md "Requests from browsers")."""

    path: Path | None = None
    legacy_token: str | None = None
    _entries: list[_Entry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reader: threading.Thread | None = None

    @classmethod
    def from_settings(cls, *, tokens_file: str | Path | None, token: str | None) -> Principals:
        """Load ``tokens_file`` (JSON, see the module docs) and take ``token`` (the single
        ``LOCSTATUS_API_TOKEN``) as the ``operator`` principal. Raises :class:`InvalidInput`
        naming what is wrong in the file (never a token)."""
        p = cls(path=Path(tokens_file) if tokens_file else None)
        if token:
            p.legacy_token = check_secret(token, "the API token (LOCSTATUS_API_TOKEN)")
        if p.path is not None:
            p._entries = p._read()
        return p

    def _read(self) -> list[_Entry]:
        assert self.path is not None
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInput(
                f"cannot read the tokens file {self.path} (LOCSTATUS_API_TOKENS_FILE): "
                f"{exc.strerror}"
            ) from None
        return _parse(text, str(self.path))

    def reload(self, timeout: float = RELOAD_TIMEOUT) -> bool:
        """Read the tokens file again (SIGHUP; call it off the event loop). True if the new
        set is in force. The file is read on a thread of its own, given ``timeout`` seconds
        (a FIFO or a hung NFS mount as the file must not stall the caller); on a timeout, an
        unreadable or invalid file, or a file naming no principal (which would lock every
        caller out) the previous set stays and the reason is logged (docs/http.md "Callers
        and roles")."""
        if self.path is None:
            return False
        keep = "tokens file not reloaded, the previous tokens stay in force"
        with self._lock:
            if self._reader is not None and self._reader.is_alive():
                log.error("%s: the previous reload of %s is still reading it", keep, self.path)
                return False
            result: list[list[_Entry] | InvalidInput] = []

            def read() -> None:
                try:
                    result.append(self._read())
                except InvalidInput as exc:
                    result.append(exc)

            self._reader = threading.Thread(target=read, name="tokens-reload", daemon=True)
            self._reader.start()
        self._reader.join(timeout)
        if not result:
            log.error("%s: reading %s took over %gs", keep, self.path, timeout)
            return False
        entries = result[0]
        if isinstance(entries, InvalidInput):
            log.error("%s: %s", keep, entries)
            return False
        if not entries:
            log.error("%s: %s names no principal (every caller would be refused)", keep,
                      self.path)
            return False
        with self._lock:
            self._entries = entries
        log.info("tokens file %s reloaded: %d principal(s)", self.path, len(entries))
        return True

    @property
    def enabled(self) -> bool:
        return self.legacy_token is not None or self.path is not None

    def is_token(self, text: str) -> bool:
        """True if ``text`` is the token of a principal of the tokens file (compared by
        hash; for log redaction, not authentication)."""
        digest = hashlib.sha256(text.encode()).digest()
        with self._lock:
            return any(e.digest == digest for e in self._entries)

    def names(self) -> list[str]:
        with self._lock:
            return [e.principal.name for e in self._entries]

    def authenticate(self, token: str) -> Principal | None:
        """The principal ``token`` belongs to, or None. Every entry is compared (constant time
        in which one matched)."""
        digest = hashlib.sha256(token.encode()).digest()
        with self._lock:
            entries = list(self._entries)
        found: Principal | None = None
        for e in entries:
            if hmac.compare_digest(digest, e.digest):
                found = e.principal
        if self.legacy_token is not None and hmac.compare_digest(
            digest, hashlib.sha256(self.legacy_token.encode()).digest()
        ):
            found = found or Principal("operator", Role.OPERATOR, forward_actor=True)
        return found


_DOING = {
    "read": "read",
    "worker": "use the worker routes",
    "operate": "pause, resume, schedule or cancel",
    "admin": "use administrative routes",
}


def require(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    action: str,
    worker_id: str | None = None,
) -> Principal | None:
    """Authenticate the request for ``action`` (``read``, ``worker``, ``operate``, ``admin``;
    with ``worker_id``: acting as that worker) and keep the principal in
    ``request.state.principal`` (None when the sidecar has no token). Raises
    :class:`Unauthorized` (401: no bearer token) or a 403 problem: an unknown token, or a
    principal whose role may not (the answer names the principal and its role, never the
    token)."""
    principals: Principals = request.app.state.locstatus.principals
    request.state.principal = None
    if not principals.enabled:
        return None
    if credentials is None or not credentials.credentials:
        raise Unauthorized(
            "this route needs an Authorization header with a bearer token of the sidecar "
            "(LOCSTATUS_API_TOKEN or LOCSTATUS_API_TOKENS_FILE)"
        )
    who = principals.authenticate(credentials.credentials)
    if who is None:
        raise ProblemError(403, "forbidden", "the bearer token is not one of the sidecar's tokens",
                           type_="urn:locstatus:forbidden")
    if not who.may(action):
        raise ProblemError(
            403, "forbidden",
            f"principal {who.name!r} (role {who.role.value}) may not {_DOING[action]}",
            type_="urn:locstatus:role",
        )
    if worker_id is not None and not who.may_act_as(worker_id):
        raise ProblemError(
            403, "forbidden",
            f"principal {who.name!r} (role {who.role.value}) may act as its own workers only, "
            f"not as {worker_id!r}",
            type_="urn:locstatus:role",
        )
    request.state.principal = who
    return who


def actor_for(request: Request, given: str | None) -> str | None:
    """The actor to record for a change: the principal's name, or ``given`` when the principal
    may forward another's (``forward_actor``) or the sidecar has no token. Raises a 403
    problem for an ``actor`` the principal may not name."""
    who: Principal | None = getattr(request.state, "principal", None)
    if who is None:
        return given
    if given is None or given == who.name:
        return who.name
    if who.forward_actor:
        return given
    raise ProblemError(
        403, "forbidden",
        f"principal {who.name!r} may not name another actor ({given[:64]!r}): the actor is "
        "the principal; a proxy that forwards its users' names needs \"forward_actor\": true "
        "in the tokens file",
        type_="urn:locstatus:role",
    )


def new_token(name: str, role: str, *, forward_actor: bool = False) -> tuple[str, dict[str, Any]]:
    """A fresh token for a caller ``name`` with ``role`` (``read``, ``worker``, ``operator`` or
    ``admin``) and its tokens-file entry (``{"name", "role", "sha256"[, "forward_actor"]}``),
    as ``locstatus tokens new`` prints them. Raises :class:`InvalidInput` for a name or role the
    tokens file would refuse."""
    token = secrets.token_urlsafe(32)
    entry: dict[str, Any] = {"name": name, "role": role, "sha256": hash_token(token)}
    if forward_actor:
        entry["forward_actor"] = True
    _parse(json.dumps({"principals": [entry]}), "the new entry")
    return token, entry
