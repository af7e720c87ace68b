"""Backend URLs: splitting them, reading their query parameters and showing them without their
credentials, once for every backend.

Why it is shaped so: a backend URL comes from a command line, an environment variable or a
library call, and each backend used to parse its own. A URL that does not parse
(``zk://[::1/x``), one that is not a string at all (``connect(5)``) or that carries a NUL byte
raised Python's own ``ValueError``/``AttributeError``; a number that parses but means nothing
was accepted (``timeout=-1``, ``timeout=nan``) or broke a thread later (``poll_interval=0``
busy-loops a core, ``1e308`` overflows the poller's wait and kills it). Here every URL is checked
as text first (:func:`split_url`), and every numeric parameter is declared once with its
documented bounds and unit (:class:`Number`), so the error names the parameter, the value and
what is expected, before anything connects. A URL shown in a message or a report goes through
:func:`redact_url` (credentials replaced by ``***``), the one place that knows how.

Usage::

    parts = split_url(url, "SQLite", "sqlite:///path/to/file.db")
    params = query_params(parts.query, known={"timeout", "poll_interval"}, kind="SQLite",
                          where=url)
    timeout = Number("timeout", 30, 0, 3600, low_open=True).parse(params.get("timeout"),
                                                                   "SQLite", url)
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qs, urlsplit, urlunsplit

from locstatus.errors import InvalidInput

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_USERINFO = re.compile(r"//[^/]*@")


def redact_url(url: object) -> str:
    """``url`` as it may be shown: whatever precedes the host's ``@`` (user and password) is
    ``***``, so ``mongodb://u:secret@db1,db2/`` reads ``mongodb://***@db1,db2/``. A URL that
    does not split (an unclosed ``[``) has everything between ``//`` and an ``@`` hidden; one
    without credentials is returned as it is. Not a URL string: its ``str``."""
    text = str(url)
    try:
        parts = urlsplit(text)
    except ValueError:  # does not split: hide whatever precedes an "@" after "//"
        return _USERINFO.sub("//***@", text)
    if "@" not in parts.netloc:
        return text
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def check_url_text(url: object, kind: str, example: str, *, where: str | None = None) -> str:
    """Return ``url`` if it is a string without control characters (a NUL in a path reaches the
    OS as a truncated name, or as Python's ``ValueError``). ``kind`` names the backend in
    messages (``SQLite``), ``example`` is a URL of the expected form, ``where`` the URL as it
    may be shown (credentials removed; default ``url``). Raises :class:`InvalidInput`."""
    if not isinstance(url, str):
        raise InvalidInput(
            f"a backend URL must be a string such as {example}, got {type(url).__name__} "
            f"{_shown(repr(url))}"
        )
    bad = _CONTROL.search(url)
    if bad is not None:
        shown = where if where is not None else url
        raise InvalidInput(
            f"invalid {kind} URL {_shown(repr(shown), 120)}: control character "
            f"U+{ord(bad.group()):04X} at position {bad.start()}"
        )
    return url


def split_url(
    url: object, kind: str, example: str, *, where: str | None = None, port: int | None = None
) -> SplitResult:
    """``urlsplit(url)`` for a backend URL, after :func:`check_url_text` (same arguments).

    ``port`` is the backend's default port, shown in the hint for a bracketed IPv6 address
    (``[::1]:27017`` for MongoDB); None for a backend whose URLs name no host (SQLite).
    Raises :class:`InvalidInput` as :func:`check_url_text` does, and when the URL does not
    split (an unclosed ``[`` of an IPv6 address)."""
    url = check_url_text(url, kind, example, where=where)
    shown = where if where is not None else url
    try:
        return urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL", and friends
        hint = "" if port is None else f"; an IPv6 address goes in brackets: [::1]:{port}"
        raise InvalidInput(
            f"invalid {kind} URL {_shown(repr(shown), 120)}: {exc} (expected {example}{hint})"
        ) from None


def query_params(
    query: str, *, known: Collection[str], kind: str, where: str
) -> dict[str, str]:
    """The parameters of a URL query, last value of each. Raises :class:`InvalidInput` naming
    any parameter not in ``known``."""
    try:
        params = {
            k: v[-1]
            for k, v in parse_qs(query, keep_blank_values=True, strict_parsing=False).items()
        }
    except ValueError as exc:
        raise InvalidInput(f"invalid {kind} URL query in {where!r}: {exc}") from None
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InvalidInput(
            f"unknown {kind} URL parameter {', '.join(_shown(u, 40) for u in unknown)} in "
            f"{where!r}: expected {', '.join(sorted(known))}"
        )
    return params


@dataclass(frozen=True)
class Number:
    """A numeric URL parameter: its name, default, documented bounds and unit.

    ``low`` is included unless ``low_open`` (``timeout`` must be more than 0); ``high`` is
    included. ``integer`` parameters refuse fractions. NaN and infinities are never accepted.
    """

    name: str
    default: float
    low: float
    high: float
    unit: str = "seconds"
    integer: bool = False
    low_open: bool = False

    @property
    def bounds(self) -> str:
        """The accepted range, as the docs give it: ``0.05..60``, ``more than 0, at most 3600``."""
        low, high = _number(self.low), _number(self.high)
        if self.low_open:
            return f"more than {low}, at most {high} {self.unit}"
        return f"{low}..{high} {self.unit}"

    def parse(self, raw: str | None, kind: str, where: str) -> float:
        """The value of ``raw`` (None: the default). Raises :class:`InvalidInput` naming the
        parameter, the value and the bounds."""
        if raw is None:
            return self.default
        text = raw.strip()
        try:
            value = float(int(text)) if self.integer else float(text)
        except ValueError:
            value = math.nan
        too_low = value <= self.low if self.low_open else value < self.low
        if not math.isfinite(value) or too_low or value > self.high:
            what = "a whole number" if self.integer else "a number"
            raise InvalidInput(
                f"invalid {kind} URL parameter {self.name}={_shown(raw, 40)} in {where!r}: "
                f"expected {what}, {self.bounds}"
            )
        return value


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
