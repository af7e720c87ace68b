"""Location lists: which locations exist and which services each one has (docs/design.md §5.2).

Operators already describe their sites somewhere; this module reads those files so
``locstatus locations sync`` and ``locstatus check --locations`` never need a second list kept by
hand. Three formats are recognised by their content, not by their file name:

- **plain list**: one location per line, ``#`` starts a comment, blank lines are ignored; every
  configured service exists at every listed location. A JSON array of names means the same.
- **Backbeat ``config.json``** (a JSON object with ``extensions``): replication sites from
  ``extensions.replication.destination.bootstrapList[].site``, ingestion locations from
  ``extensions.ingestion.sources[].locationConstraint``; with an optional
  **``locationConfig.json``** whose every key is a lifecycle location.
- **``locationConfig.json`` alone** (a JSON object of location objects): lifecycle locations.

A service only exists at the locations that define it, so the result maps each location to its
own sorted services, the shape :meth:`locstatus.Manager.sync_locations` takes. Services outside
the configured set are left out (a deployment configured without ingestion ignores the
ingestion sources), and a location left without any service is left out with them.

Everything is validated before anything is returned, so a bad file never half-applies: a
missing file, invalid UTF-8 or JSON, a section of the wrong shape, an invalid location name, or a
file that names no location at all (syncing it would tombstone every location) raises
:class:`~locstatus.errors.InvalidInput` naming the file and the bad value or JSON path.
``all`` is refused as a location name: the CLI and the HTTP API use it for bulk operations.

Usage::

    from locstatus import connect
    from locstatus.locations import load_locations

    wanted = load_locations("config.json", "locationConfig.json")
    # {"us-east-1": ("ingestion", "lifecycle"), "dr-site-a": ("replication",), ...}
    connect().sync_locations(wanted)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

from locstatus.errors import InvalidInput
from locstatus.names import DEFAULT_SERVICES, SERVICE_ALIASES, canonical_service, check_location

LocationMap = dict[str, tuple[str, ...]]
"""location -> sorted service names."""

MAX_FILE_BYTES = 16 * 1024 * 1024
"""Larger files are refused: no location list is anywhere near this size."""

RESERVED_NAMES = frozenset({"all"})
"""Location names the CLI and HTTP API use as keywords (bulk operations)."""

REPLICATION = "replication"
INGESTION = "ingestion"
LIFECYCLE = "lifecycle"

SAMPLE_FILES = ("config.json", "locationConfig.json", "locations.txt")
"""The project's own samples, shipped as package data in ``locstatus/samples``."""


def sample_path(name: str) -> Path:
    """Path of a packaged sample (one of :data:`SAMPLE_FILES`), e.g. ``"config.json"``.

    Raises :class:`InvalidInput` for any other name.
    """
    if name not in SAMPLE_FILES:
        raise InvalidInput(f"unknown sample {name!r}: expected one of {', '.join(SAMPLE_FILES)}")
    return Path(str(files("locstatus").joinpath("samples", name)))


def load_sample(services: Iterable[str] = DEFAULT_SERVICES) -> LocationMap:
    """The locations of the packaged Backbeat-style samples (``config.json`` with
    ``locationConfig.json``), for the quick start and the demo."""
    return load_locations(
        sample_path("config.json"), sample_path("locationConfig.json"), services=services
    )


def load_locations(
    path: str | Path,
    location_config: str | Path | None = None,
    *,
    services: Iterable[str] = DEFAULT_SERVICES,
) -> LocationMap:
    """Read a location list and return ``{location: sorted services}``.

    ``path`` is a plain list, a JSON array of names, a Backbeat ``config.json`` or a
    ``locationConfig.json`` (detected by content). ``location_config`` is the
    ``locationConfig.json`` that goes with a Backbeat ``config.json`` (its keys are the
    lifecycle locations); it is refused with any other format. ``services`` is the configured
    service set: a plain list gives each location all of them; Backbeat services outside it are
    left out.

    Raises :class:`InvalidInput` naming the file and the bad value or JSON path when a file
    cannot be read, does not parse, has the wrong shape, names an invalid location, or names no
    location at all.
    """
    configured = _configured(services)
    text = _read(path)
    body = text.lstrip()
    if not body.startswith(("{", "[")):
        if location_config is not None:
            raise InvalidInput(
                f"{path}: a plain location list takes no location config "
                f"(got {str(location_config)!r}); --location-config goes with a Backbeat "
                "config.json"
            )
        found = {name: set(configured) for name in _parse_plain(path, text)}
    else:
        data = _parse_json(path, text)
        if isinstance(data, list):
            if location_config is not None:
                raise InvalidInput(
                    f"{path}: a JSON list of locations takes no location config "
                    f"(got {str(location_config)!r})"
                )
            found = {name: set(configured) for name in _parse_name_array(path, data)}
        elif isinstance(data, dict) and "extensions" in data:
            found = _parse_backbeat(path, data)
            if location_config is not None:
                lc_data = _parse_json(location_config, _read(location_config))
                for name in _parse_location_config(location_config, lc_data):
                    found.setdefault(name, set()).add(LIFECYCLE)
        else:  # an object without "extensions": a locationConfig.json on its own
            if location_config is not None:
                raise InvalidInput(
                    f"{path}: not a Backbeat config.json (no 'extensions' key), so it takes "
                    f"no location config (got {str(location_config)!r})"
                )
            found = {name: {LIFECYCLE} for name in _parse_location_config(path, data)}
    wanted = {name: tuple(sorted(svcs & set(configured))) for name, svcs in sorted(found.items())}
    result = {name: svcs for name, svcs in wanted.items() if svcs}
    if not result:
        sources = str(path) if location_config is None else f"{path} and {location_config}"
        detail = f" with any of the configured services ({', '.join(configured)})" if wanted else ""
        raise InvalidInput(
            f"{sources}: no location found{detail}; refusing an empty list "
            "(syncing it would remove every location)"
        )
    return result


def dump_plain(locations: Mapping[str, Iterable[str]]) -> str:
    """A plain list file (one name per line) for ``locations``; services are not kept."""
    return "".join(f"{name}\n" for name in sorted(locations))


# -- internals -----------------------------------------------------------------------------


def _configured(services: Iterable[str]) -> tuple[str, ...]:
    if isinstance(services, str):
        raise InvalidInput(f"services must be a list of names, not the string {services!r}")
    names = [SERVICE_ALIASES.get(s, s) if isinstance(s, str) else s for s in services]
    if not names:
        raise InvalidInput("no service configured")
    return tuple(dict.fromkeys(canonical_service(s, names) for s in names))


def _read(path: str | Path) -> str:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a directory, expected a file") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a location list")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None


def _parse_json(path: str | Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{path}: invalid JSON: nested too deeply") from None


def _location(path: str | Path, where: str, value: object) -> str:
    """Validate one location name found at ``where`` in ``path``."""
    if not isinstance(value, str):
        raise InvalidInput(f"{path}: {where}: expected a location name, got {_json_type(value)}")
    try:
        check_location(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{path}: {where}: {exc.message}") from None
    if value in RESERVED_NAMES:
        raise InvalidInput(
            f"{path}: {where}: location name {value!r} is reserved for bulk operations"
        )
    return value


def _parse_plain(path: str | Path, text: str) -> list[str]:
    names: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if content:
            names.append(_location(path, f"line {lineno}", content))
    return names


def _parse_name_array(path: str | Path, data: list[Any]) -> list[str]:
    return [_location(path, f"[{i}]", item) for i, item in enumerate(data)]


def _get(path: str | Path, data: Mapping[str, Any], where: str, key: str, kind: type) -> Any:
    """``data[key]`` if present (None otherwise), refusing a value that is not ``kind``."""
    if key not in data or data[key] is None:
        return None
    value = data[key]
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise InvalidInput(f"{path}: {where}{key}: expected {expected}, got {_json_type(value)}")
    return value


def _parse_backbeat(path: str | Path, data: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    ext = _get(path, data, "", "extensions", dict)
    if ext is None:
        return found
    repl = _get(path, ext, "extensions.", "replication", dict)
    if repl is not None:
        dest = _get(path, repl, "extensions.replication.", "destination", dict)
        if dest is not None:
            where = "extensions.replication.destination."
            sites = _get(path, dest, where, "bootstrapList", list) or []
            for i, item in enumerate(sites):
                at = f"{where}bootstrapList[{i}]"
                if not isinstance(item, dict):
                    raise InvalidInput(f"{path}: {at}: expected an object, got {_json_type(item)}")
                if "site" not in item:
                    raise InvalidInput(f"{path}: {at}: missing 'site'")
                name = _location(path, f"{at}.site", item["site"])
                found.setdefault(name, set()).add(REPLICATION)
    ingestion = _get(path, ext, "extensions.", "ingestion", dict)
    if ingestion is not None:
        sources = _get(path, ingestion, "extensions.ingestion.", "sources", list) or []
        for i, item in enumerate(sources):
            at = f"extensions.ingestion.sources[{i}]"
            if not isinstance(item, dict):
                raise InvalidInput(f"{path}: {at}: expected an object, got {_json_type(item)}")
            if "locationConstraint" not in item:
                raise InvalidInput(f"{path}: {at}: missing 'locationConstraint'")
            name = _location(path, f"{at}.locationConstraint", item["locationConstraint"])
            found.setdefault(name, set()).add(INGESTION)
    return found


def _parse_location_config(path: str | Path, data: Any) -> list[str]:
    if not isinstance(data, dict):
        raise InvalidInput(
            f"{path}: expected a locationConfig.json object (location name -> settings), "
            f"got {_json_type(data)}"
        )
    names: list[str] = []
    for key, value in data.items():
        name = _location(path, f"key {_short(key)}", key)
        if not isinstance(value, dict):
            raise InvalidInput(
                f"{path}: {key}: expected the location's settings object, got {_json_type(value)}"
            )
        names.append(name)
    return names


def _short(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {_short(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
