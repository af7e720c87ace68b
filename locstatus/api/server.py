"""``locstatus serve``: the sidecar process (docs/design.md §5.3) - uvicorn, the reconciler, the
check job.

Why it is shaped so:

- Loopback by default; binding any other address without a token is refused (``--insecure``
  overrides, loudly), because the mutating routes would otherwise be open to the network.
  Without a token, only loopback ``Host`` names are served (plus ``--allow-host`` names; every
  one with ``--insecure`` on a non-loopback address): a web page cannot reach a loopback
  sidecar by DNS rebinding (:mod:`locstatus.api.guard`). A token no client could send
  (non-ASCII, surrounding spaces) is refused before anything starts. The
  socket is bound here before uvicorn starts, so a bad address or a port in use is a clear
  :class:`InvalidInput` (CLI exit 2), not a log line and ``sys.exit`` from inside uvicorn.
- The reconciler (:mod:`locstatus.reconciler`) runs as a thread in the same process: any number
  of sidecars may run against one backend, and the manager's guards make each due resume fire
  exactly once.
- With ``check_interval``, the consistency check of :mod:`locstatus.check` (when installed) runs
  read-only in a thread and its last result is served at ``/v1/check``.
- Log lines and error documents go through :func:`~locstatus.api.problems.redact`: the token and
  credentials in backend URLs never reach a log or a client. Headers are never logged.

:class:`BackgroundServer` runs any ASGI app on a thread (tests, the demo).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import ipaddress
import logging
import signal
import socket
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import uvicorn

from locstatus import monotonic
from locstatus.api.app import create_app
from locstatus.api.auth import check_token
from locstatus.api.backbeat_trust import TrustedPeers
from locstatus.api.context import CheckState
from locstatus.api.guard import split_host
from locstatus.api.principals import Principals
from locstatus.api.problems import SECRETS, redact
from locstatus.api.series import DEFAULT_LIMIT
from locstatus.api.workers import close_hub
from locstatus.client import connect
from locstatus.errors import InvalidInput
from locstatus.logs import check_log_format, configure_logging
from locstatus.manager import Manager
from locstatus.reconciler import Reconciler
from locstatus.settings import Settings

log = logging.getLogger("locstatus.api")


def serve(
    url: str | None,
    *,
    host: str,
    port: int,
    token: str | None,
    insecure: bool,
    reconcile_interval: float,
    check_interval: float | None,
    allowed_hosts: Sequence[str] = (),
    backbeat_trust: Sequence[str] = (),
    location_series: int = DEFAULT_LIMIT,
    log_format: str = "text",
) -> None:
    """Run the sidecar until interrupted (SIGINT/SIGTERM).

    - ``url``: backend URL; None means ``$LOCSTATUS_BACKEND`` (default ``sqlite:///./locstatus.db``).
    - ``host``/``port``: where to listen (port 0 picks a free port, logged).
    - ``token``: bearer token for mutating routes; None falls back to ``$LOCSTATUS_API_TOKEN``.
    - ``insecure``: allow a non-loopback ``host`` without a token.
    - ``reconcile_interval``: seconds between full reconcile passes (> 0).
    - ``check_interval``: seconds between read-only consistency checks, or None for none.
    - ``allowed_hosts``: ``Host`` names served besides loopback ones when there is no token
      (e.g. the name a local proxy forwards); see :func:`~locstatus.api.app.create_app`.
    - ``backbeat_trust``: networks (CIDR) whose peers may call the Backbeat-route mutations
      without the token: where CloudServer connects from (docs/http.md, "Putting locstatus
      where Backbeat's API server was").
    - ``location_series``: at most this many per-location series in ``/metrics`` (0: none).
    - ``log_format``: ``text`` or ``json`` (one object per line, :mod:`locstatus.logs`), for
      the sidecar's own records and uvicorn's.

    Raises :class:`InvalidInput` for a non-loopback bind without a token, a token no client
    could send, a bad port, interval or host name, or an address that cannot be bound;
    :class:`BackendUnavailable` when the backend cannot be reached.
    """
    if token is None:
        secret = Settings().api_token
        token = secret.get_secret_value() if secret is not None else None
    token = check_token(token) if token else None
    principals = Principals.from_settings(tokens_file=Settings().api_tokens_file, token=token)
    for name in allowed_hosts:
        if not name or name == "*" or split_host(name) is None:
            raise InvalidInput(
                f"invalid --allow-host {name!r}: expected a host name or address such as "
                "s3.zenko.local (any port is served)"
            )
    trusted = TrustedPeers(backbeat_trust)  # a bad network is refused before anything starts
    if not host:
        raise InvalidInput("empty --host: give an address such as 127.0.0.1")
    if not 0 <= port <= 65535:
        raise InvalidInput(f"invalid port {port}: expected 0..65535")
    if not reconcile_interval > 0:
        raise InvalidInput(f"reconcile interval must be > 0 seconds, got {reconcile_interval}")
    if check_interval is not None and not check_interval > 0:
        raise InvalidInput(f"check interval must be > 0 seconds, got {check_interval}")
    log_format = check_log_format(log_format)
    if location_series < 0:
        raise InvalidInput(f"--location-series must be >= 0, got {location_series}")
    loopback = is_loopback(host)
    if not loopback and not principals.enabled and not insecure:
        raise InvalidInput(
            f"refusing to serve on non-loopback address {host!r} without an API token: set "
            "LOCSTATUS_API_TOKEN (mutating routes then need 'Authorization: Bearer <token>'), "
            "bind 127.0.0.1, or pass --insecure to serve unauthenticated mutations"
        )
    SECRETS.add(token)
    sock = bind_socket(host, port)
    try:
        mgr = connect(url)
    except BaseException:
        sock.close()
        raise
    reconciler = Reconciler(mgr, interval=reconcile_interval)
    check_state = CheckState() if check_interval is not None else None
    app = create_app(
        mgr, token=token, reconciler=reconciler, check=check_state, principals=principals,
        # --insecure on a non-loopback address serves the network on purpose: any Host
        allowed_hosts=["*"] if insecure and not loopback else allowed_hosts,
        backbeat_trust=backbeat_trust,
        location_series=location_series,
    )
    reconciler.observer = app.state.locstatus.metrics.transition
    checker = (
        _CheckRunner(mgr, check_interval, check_state)
        if check_interval is not None and check_state is not None
        else None
    )
    if log_format == "json":
        # uvicorn's records go to the root logger's JSON handler instead of its own config
        configure_logging("json")
        logging.getLogger("kazoo").setLevel(logging.WARNING)
    # proxy_headers off: the peer is the socket's address, never a client's X-Forwarded-For
    # (the --backbeat-trust rule trusts the peer).
    config = uvicorn.Config(
        app, log_level="info", server_header=False, lifespan="off", proxy_headers=False,
        log_config=None if log_format == "json" else uvicorn.config.LOGGING_CONFIG,
    )
    SECRETS.recognize(principals.is_token)  # the tokens file's, known by hash only
    _install_redaction()
    bound = sock.getsockname()
    log.info(
        "locstatus sidecar on http://%s:%s, backend %s, auth %s, reconcile every %gs%s%s",
        _host_for_url(bound[0]), bound[1], redact(mgr.backend.url),
        _auth_mode(principals, token) if principals.enabled
        else "none (loopback only)" if loopback else "NONE (--insecure)",
        reconcile_interval,
        f", check every {check_interval:g}s" if check_interval else "",
        f", Backbeat-route mutations need no token from {trusted.describe()} (--backbeat-trust)"
        if trusted else "",
    )
    if not loopback and not principals.enabled:
        log.warning("--insecure: mutating routes on %s need no authentication", host)
    if principals.path is not None:
        # Off the event loop: a tokens file that blocks on read must not stall /healthz.
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(
            target=principals.reload, name="sighup-reload", daemon=True).start())
    reconciler.start()
    if checker is not None:
        checker.start()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if checker is not None:
            checker.stop()
        reconciler.stop()
        close_hub(app)
        mgr.close()
        sock.close()


def _auth_mode(principals: Principals, token: str | None) -> str:
    """How callers authenticate, for the start-up line (principal counts, never a token)."""
    if principals.path is None:
        return "token required"
    named = f"tokens file {principals.path} ({len(principals.names())} principal(s))"
    return named + (" and LOCSTATUS_API_TOKEN" if token else "")


def is_loopback(host: str) -> bool:
    """True if ``host`` (an address or a name) only designates loopback addresses."""
    name = host.strip().strip("[]")
    if name.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet). Raises :class:`InvalidInput`."""
    name = host.strip().strip("[]")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise InvalidInput(f"cannot resolve {host!r}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        message = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        if exc.errno == errno.EADDRINUSE:
            message += (
                f" (another process, perhaps another sidecar, has port {port}): pick another "
                "with --port N, or --port 0 for any free one (the log names the port it got)"
            )
        raise InvalidInput(message) from None
    sock.set_inheritable(True)
    return sock


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# -- periodic consistency check ----------------------------------------------------------------


class _CheckRunner:
    """Runs ``locstatus.check.run_check(mgr, repair=False)`` every ``interval`` seconds."""

    def __init__(self, mgr: Manager, interval: float, state: CheckState) -> None:
        self.mgr = mgr
        self.interval = interval
        self.state = state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            module = importlib.import_module("locstatus.check")
        except ImportError:
            log.warning("--check-interval given but locstatus.check is not available; no check")
            return
        run_check = getattr(module, "run_check", None)
        if run_check is None:
            log.warning("locstatus.check has no run_check(); no periodic check")
            return
        self._thread = threading.Thread(
            target=self._loop, args=(run_check,), name="locstatus-check", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self, run_check: Any) -> None:
        log_report = getattr(importlib.import_module("locstatus.check"), "log_report", None)
        known: set[str] = set()
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                result = run_check(self.mgr, repair=False)
            except Exception as exc:
                message = redact(f"{type(exc).__name__}: {exc}")
                log.warning("consistency check failed: %s", message)
                with self.state.lock:
                    self.state.error = message
                    self.state.at = self.mgr.clock()
            else:
                if log_report is not None:  # new findings, the repairs and a summary
                    log_report(result, known=known)
                    known = {f.id for f in result.findings}
                with self.state.lock:
                    self.state.result = result
                    self.state.error = None
                    self.state.at = self.mgr.clock()
                    self.state.duration = time.monotonic() - start
            self._stop.wait(self.interval)


# -- logging -----------------------------------------------------------------------------------


class _RedactFilter(logging.Filter):
    """Removes the token and URL credentials from every record a handler emits."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler
            return True
        if redact(message) != message:
            # Redact the message and each argument, keeping args a tuple: a formatter may
            # unpack them (uvicorn's access log does).
            if isinstance(record.msg, str):
                record.msg = redact(record.msg)
            if isinstance(record.args, tuple):
                record.args = tuple(_redact_arg(a) for a in record.args)
            elif isinstance(record.args, Mapping):
                record.args = {k: _redact_arg(v) for k, v in record.args.items()}
            try:
                again = record.getMessage()
            except Exception:  # an argument's type changed under its %-format
                again = message
            if redact(again) != again:  # a secret across message and arguments
                record.msg, record.args = redact(again), ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        return True


def _redact_arg(arg: object) -> object:
    """``arg`` itself unless its text holds a secret, else that text redacted."""
    text = str(arg)
    clean = redact(text)
    return arg if clean == text else clean


def _install_redaction() -> None:
    """Attach the redaction filter to every handler (uvicorn's and ours); give ``locstatus``
    loggers a handler when nothing else configured one."""
    locstatus_log = logging.getLogger("locstatus")
    if not logging.getLogger().handlers and not locstatus_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        locstatus_log.addHandler(handler)
        locstatus_log.setLevel(logging.INFO)
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for h in lg.handlers:
            if not any(isinstance(f, _RedactFilter) for f in h.filters):
                h.addFilter(_RedactFilter())


# -- a server on a thread (tests, demo) --------------------------------------------------------


class BackgroundServer:
    """Serve an ASGI app with uvicorn on a background thread.

    Usage::

        with BackgroundServer(create_app(mgr)) as server:
            httpx.get(server.url + "/healthz")
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, **config: Any
    ) -> None:
        config.setdefault("log_level", "warning")
        config.setdefault("lifespan", "off")
        config.setdefault("proxy_headers", False)  # as serve(): the peer is the socket's
        self.sock = bind_socket(host, port)
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, **config))
        self._thread: threading.Thread | None = None
        host_, port_ = self.sock.getsockname()[:2]
        self.url = f"http://{_host_for_url(host_)}:{port_}"
        """Base URL, e.g. ``http://127.0.0.1:41234``."""

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        """Start serving; returns once the server accepts connections. Raises RuntimeError."""
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="locstatus-http",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server at {self.url} did not start")
            monotonic.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        self.server.should_exit = True
        if hasattr(getattr(self.app, "state", None), "locstatus"):
            close_hub(self.app)  # open watch streams end, so the server can stop
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
