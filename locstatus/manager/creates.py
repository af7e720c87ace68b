"""A sync's creates at fleet scale: the records, history entries and stored texts of many new
locations from one template per batch, not from pydantic's validators and encoders at each.

Why: a ``locations sync`` of 100 000 new locations spent most of its time per location in
Python: a service status, a record and a history entry validated by pydantic, then both encoded
by it (docs/benchmarks.md, "Bulk operations"). Across a batch the creates are the same but for
the location and the operation id: one time (the batch's), one actor, a handful of distinct
service lists. So:

- **One template per service list.** The first location of a batch with a given service list
  is made the general way (:func:`new_record`: validated models), and its record and history
  entry are encoded by the codec with sentinels in place of the operation id and the location;
  every other location of the list is a copy of those models with its own location and id
  (:func:`~locstatus.models.copy_with`: no validation, the names were checked by the caller and
  the ids are fresh hex), its texts the template's with the sentinels replaced.
- **The same bytes.** Each template's first texts are compared with the codec's own encoding of
  its first record and entry (a location name or an id is written by JSON as it is, so the
  substitution cannot change the rest); a batch where one differs gets no texts, and the
  backend encodes its records itself.
- **Still one create per location**, each with its own operation id (the one its record and
  history carry, by which an ambiguous write is recognised, docs/design.md §3.2), written by
  :meth:`~locstatus.backends.base.Backend.create_many`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final

from locstatus.backends import codec
from locstatus.backends.base import CreateItem
from locstatus.backends.versions import LIVES
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, copy_with, new_op_id

from .plans import record_entry

FIRST_VERSION: Final = LIVES.first(0)
"""The version a create's history is stamped with in :meth:`Backend.create_many`'s texts (a
first life's create on every backend: :data:`~locstatus.backends.versions.LIVES`, as the
backends' own ``create_many`` stamp it)."""

_OP: Final = "\x00op\x00"
"""Stands for the operation id in a template: JSON writes it ``"\\u0000op\\u0000"``, which no
other field's text holds (free text has no control character, a name matches its pattern)."""
_LOCATION: Final = "\x00location\x00"
"""Stands for the location in a history template (as :data:`_OP`)."""
_OP_JSON: Final = codec.json_text(_OP)[1:-1]
_LOCATION_JSON: Final = codec.json_text(_LOCATION)[1:-1]


def new_record(
    location: str, services: Sequence[str], now: datetime, actor: str | None, op_id: str
) -> tuple[LocationStatus, list[HistoryEntry]]:
    """A new location's record (each of ``services`` running, written by ``op_id`` at ``now``
    UTC) and the history of its create, validated. Raises :class:`pydantic.ValidationError`
    for a value its fields refuse (the caller checks names and free text first)."""
    rec = LocationStatus(
        location=location,
        services={s: ServiceStatus(op_id=op_id, updated_at=now, actor=actor) for s in services},
    )
    return rec, [record_entry(location, "create", op_id, now, actor)]


def new_op_ids(count: int) -> list[str]:
    """``count`` fresh operation ids of 32 hex characters, as :func:`~locstatus.models.new_op_id`
    makes them, from one read of the system's random source."""
    if count <= 1:
        return [new_op_id() for _ in range(count)]
    raw = os.urandom(16 * count).hex()
    return [raw[k:k + 32] for k in range(0, 32 * count, 32)]


class _Template:
    """One service list's create: the first record and entry, and their texts cut at the
    sentinels (``record``: the parts around each service's id; ``history``: the text with
    both sentinels, replaced per location)."""

    __slots__ = ("entry", "history", "record", "record_parts")

    def __init__(self, record: LocationStatus, entry: HistoryEntry) -> None:
        self.record, self.entry = record, entry
        probe = copy_with(record, {"services": {
            name: copy_with(st, {"op_id": _OP}) for name, st in record.services.items()
        }})
        self.record_parts = codec.encode_record(probe).split(_OP_JSON)
        self.history = codec.encode_history([copy_with(
            entry, {"op_id": _OP, "location": _LOCATION, "version": FIRST_VERSION}
        )])

    def make(self, location: str, op_id: str) -> tuple[CreateItem, tuple[str, str]]:
        """The create of ``location`` by ``op_id`` and its texts."""
        services = {
            name: copy_with(st, {"op_id": op_id}) for name, st in self.record.services.items()
        }
        record = copy_with(self.record, {"location": location, "services": services})
        entry = copy_with(self.entry, {"location": location, "op_id": op_id})
        texts = (
            op_id.join(self.record_parts),
            self.history.replace(_OP_JSON, op_id).replace(_LOCATION_JSON, location),
        )
        return (record, [entry]), texts


def new_records(
    locations: Sequence[str],
    wanted: Mapping[str, Sequence[str]],
    now: datetime,
    actor: str | None,
) -> tuple[list[CreateItem], list[tuple[str, str]] | None]:
    """The creates of ``locations`` (each with the services ``wanted`` names for it, running,
    written at ``now`` UTC by ``actor``, each with its own operation id) and their stored texts
    for :meth:`~locstatus.backends.base.Backend.create_many` (None when a template's texts are
    not the codec's: the backend encodes them). The names and ``actor`` must have been checked
    (:func:`~locstatus.names.check_location`, ``check_free_text``): a copy is not validated."""
    templates: dict[tuple[str, ...], _Template] = {}
    items: list[CreateItem] = []
    texts: list[tuple[str, str]] = []
    same = True
    for location, op_id in zip(locations, new_op_ids(len(locations)), strict=True):
        services = tuple(wanted[location])
        template = templates.get(services)
        if template is None:
            record, entries = new_record(location, services, now, actor, op_id)
            template = templates[services] = _Template(record, entries[0])
            item, text = template.make(location, op_id)
            same = same and text == (
                codec.encode_record(record),
                codec.encode_history(codec.stamp(entries, FIRST_VERSION)),
            )
        else:
            item, text = template.make(location, op_id)
        items.append(item)
        texts.append(text)
    return items, texts if same else None
