"""The sidecar's read-only status page (``GET /``): server-rendered HTML, no build step.

Why it is shaped so: an operator opening the sidecar in a browser during an incident needs, on
one page, every location x service with its state, its scheduled resume and the workers holding
up a transition, plus the state machine they are in. The page is plain HTML rendered from the
same manager reads as the JSON API. It stays current without reloading: the package's own
script (:mod:`.live`, ``page/live.js``) follows the watch stream (``GET /v1/watch``) and, on
every event, fetches this page again and swaps its tables in place; when the backend or the
sidecar stops answering it keeps the last state it showed, marked stale with its age
(docs/http.md "The status page"). Without script the page reloads itself
(``<noscript><meta http-equiv="refresh">``). It loads nothing from elsewhere (sidecars often
have no internet access). The state-machine diagram is an inline SVG drawn from
:mod:`locstatus.fsm.table` (the one definition, docs/design.md §3.6), with the generated Mermaid
source beside it. A lagging worker shows its last handler error next to its name (the errors
it publishes with its registration, as ``locstatus workers`` shows them).

Every value is HTML-escaped; the backend URL shown is redacted.
"""

from __future__ import annotations

import functools
import html
import math
from collections import Counter
from datetime import datetime

from locstatus.clock import TimeSource
from locstatus.errors import CorruptRecord, LocstatusError
from locstatus.fsm import table
from locstatus.manager import Manager, holder_away, lagging_workers, worker_live
from locstatus.models import LocationStatus, WorkerInfo, utcnow

from .problems import redact

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .3em} h2{font-size:1.1em;margin:1.5em 0 .4em}
table{border-collapse:collapse} th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3} td.none{color:#999}
.state-running{background:#e6f6e6} .state-paused{background:#fde8e8}
.state-pausing,.state-resuming{background:#fff4d6}
.state-corrupt{background:#d33;color:#fff;font-weight:bold}
.banner{background:#fde8e8;border:1px solid #d33;padding:.5em 1em}
.muted{color:#777} svg text{font:12px system-ui,sans-serif}
.handler-error{color:#a00} .stale{background:#fff4d6;border:1px solid #c90;padding:.5em 1em}
body.is-stale table#services,body.is-stale table#workers{opacity:.6}
"""

def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _cell(value: object, cls: str) -> str:
    if value is None or value == "" or value == []:
        return f'<td class="{cls} none">&mdash;</td>'
    return f'<td class="{cls}">{_e(value)}</td>'


def render(mgr: Manager, *, refresh: int = 5) -> tuple[str, int]:
    """The page's HTML and HTTP status: 200, or 503 (with an explanatory banner) when the
    backend cannot be read. ``refresh``: seconds between the live script's re-reads when the
    stream is quiet (and between reloads of a page without script), 0 for none.
    Liveness is judged on the manager's time source, times are the backend's (docs/time.md);
    only a page that cannot read the backend at all shows this host's clock as its date."""
    time_source = mgr.time
    status = 200
    error: str | None = None
    records: list[LocationStatus] = []
    corrupt: list[CorruptRecord] = []
    workers: list[WorkerInfo] = []
    acks: dict[str, dict[str, dict[str, int]]] = {}
    try:
        records, corrupt = mgr.listing()
        workers = mgr.workers()
        acks = mgr.backend.all_acks()
        now = mgr.clock()
    except LocstatusError as exc:
        status = 503
        error = redact(exc.message)
        now = utcnow()  # a date for the banner only: nothing is judged on it
    head = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        + (
            f'<noscript><meta http-equiv="refresh" content="{refresh}"></noscript>'
            if refresh > 0 else ""
        )
        + "<title>locstatus</title>"
        + f"<style>{_CSS}</style></head>"
    )
    parts = [
        head,
        f'<body data-now="{_e(_iso(now))}" data-refresh="{refresh}"'
        + (' data-backend-error="1"' if error is not None else "")
        + ">",
        '<p class="stale" id="stale" hidden></p>',
        "<h1>locstatus: pause/resume status per location and service</h1>",
        f'<p class="muted">backend <code>{_e(redact(mgr.backend.url))}</code>, '
        f"rendered at {_e(_iso(now))}"
        + '<span id="live"></span></p>',
    ]
    if error is not None:
        parts.append(f'<p class="banner" id="error">backend unavailable: {_e(error)}</p>')
    if corrupt:
        parts.append(
            f'<p class="banner" id="corrupt">{len(corrupt)} corrupt record(s), shown as '
            "CORRUPT below: their state is unknown; run <code>locstatus check</code></p>"
        )
    if error is not None:
        parts.append('<p id="summary">state unknown: the backend does not answer</p>')
    else:
        parts.append(_summary(records, len(corrupt), workers, time_source))
    parts.append(_services_table(records, corrupt, workers, acks, time_source))
    parts.append(_workers_table(workers, time_source))
    parts.append("<h2>State machine</h2>")
    parts.append(state_diagram_svg())
    parts.append(
        "<details><summary>Mermaid source (<code>GET /v1/fsm</code>)</summary><pre>"
        + _e(_mermaid())
        + "</pre></details>"
    )
    parts.append('<script src="page/live.js"></script></body></html>\n')
    return "".join(parts), status


def _summary(
    records: list[LocationStatus], corrupt: int, workers: list[WorkerInfo],
    time_source: TimeSource,
) -> str:
    states = Counter(st.state.value for r in records for st in r.services.values())
    scheduled = sum(
        1 for r in records for st in r.services.values() if st.scheduled_resume is not None
    )
    alive = sum(1 for w in workers if worker_live(w, time_source))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no services"
    locations = f"{len(records) + corrupt} locations" + (f" ({corrupt} corrupt)" if corrupt else "")
    return (
        f'<p id="summary">{locations}; services: {_e(counts)}; '
        f"scheduled resumes: {scheduled}; workers alive: {alive} of {len(workers)}</p>"
    )


def _services_table(
    records: list[LocationStatus],
    corrupt: list[CorruptRecord],
    workers: list[WorkerInfo],
    acks: dict[str, dict[str, dict[str, int]]],
    time_source: TimeSource,
) -> str:
    rows = [
        '<h2>Services</h2><table id="services"><thead><tr>'
        "<th>Location</th><th>Service</th><th>State</th><th>Generation</th>"
        "<th>Scheduled resume</th><th>Lagging workers</th><th>Reason</th><th>Actor</th>"
        "<th>Updated</th></tr></thead><tbody>"
    ]
    listed: list[LocationStatus | CorruptRecord] = [*records, *corrupt]
    for rec in sorted(listed, key=lambda r: r.location):
        if isinstance(rec, CorruptRecord):
            rows.append(_corrupt_row(rec))
            continue
        for svc, st in sorted(rec.services.items()):
            lagging = (
                lagging_workers(
                    rec.location, svc, st.generation, workers, acks.get(rec.location, {}),
                    time_source,
                )
                if st.state.transitional
                else []
            )
            if st.scheduled_resume is not None:
                when = _e(_iso(st.scheduled_resume))
                resume = (
                    f'<td class="resume"><time class="resume-at" datetime="{when}">{when}</time> '
                    '<span class="relative"></span></td>'
                )
            else:
                resume = '<td class="resume none">&mdash;</td>'
            rows.append(
                f'<tr data-location="{_e(rec.location)}" data-service="{_e(svc)}" '
                f'data-state="{_e(st.state.value)}">'
                + _cell(rec.location, "location")
                + _cell(svc, "service")
                + f'<td class="state state-{_e(st.state.value)}">{_e(st.state.value)}</td>'
                + _cell(st.generation, "generation")
                + resume
                + _lagging_cell(rec.location, svc, lagging, workers)
                + _cell(st.reason, "reason")
                + _cell(st.actor, "actor")
                + _cell(_iso(st.updated_at) if st.updated_at else None, "updated")
                + "</tr>"
            )
    if len(rows) == 1:
        rows.append('<tr><td colspan="9" class="none">no locations yet</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


def _lagging_cell(
    location: str, service: str, lagging: list[str], workers: list[WorkerInfo]
) -> str:
    """The workers holding up a transition, each with the last error its handler for this
    location and service reported (``WorkerInfo.errors``, keyed ``location/service``)."""
    if not lagging:
        return '<td class="lagging none">&mdash;</td>'
    by_id = {w.worker_id: w for w in workers}
    items = []
    for wid in lagging:
        w = by_id.get(wid)
        err = None if w is None else w.errors.get(f"{location}/{service}")
        item = f'<span class="worker" data-worker="{_e(wid)}">{_e(wid)}</span>'
        if err:
            item += f' <span class="handler-error">(last error: {_e(redact(err))})</span>'
        items.append(item)
    return f'<td class="lagging">{", ".join(items)}</td>'


def _corrupt_row(bad: CorruptRecord) -> str:
    """A record that cannot be read: its location, ``CORRUPT`` as the state, the validation
    error in place of the reason (every service's state is unknown)."""
    return (
        f'<tr data-location="{_e(bad.location)}" data-state="corrupt">'
        + _cell(bad.location, "location")
        + '<td class="service none">all</td>'
        + '<td class="state state-corrupt">CORRUPT</td>'
        + '<td class="generation none">&mdash;</td><td class="resume none">&mdash;</td>'
        + '<td class="lagging none">&mdash;</td>'
        + _cell(redact(bad.detail), "reason detail")
        + '<td class="actor none">&mdash;</td><td class="updated none">&mdash;</td>'
        + "</tr>"
    )


def _lease_text(w: WorkerInfo, time_source: TimeSource) -> str:
    """The lease column: its deadline (or ``session``); for a standing registration
    (docs/agent.md "Standing registrations") ``standing`` and, while its holder is away, since
    when."""
    lease = _iso(w.lease_expires_at) if w.lease_expires_at else "session"
    if not w.standing:
        return lease
    if holder_away(w, time_source):
        since = w.lease_expires_at
        return "standing, holder away" + (
            f" since {_iso(since)}" if since is not None and time_source.is_past(since) else ""
        )
    return f"{lease} (standing)"


def _workers_table(workers: list[WorkerInfo], time_source: TimeSource) -> str:
    rows = [
        '<h2>Workers</h2><table id="workers"><thead><tr><th>Worker</th><th>Services</th>'
        "<th>Locations</th><th>Host</th><th>PID</th><th>Lease until</th><th>Alive</th>"
        "</tr></thead><tbody>"
    ]
    for w in workers:
        rows.append(
            f'<tr data-worker="{_e(w.worker_id)}">'
            + _cell(w.worker_id, "worker")
            + _cell(
                ", ".join(w.services) if w.corrupt is None
                else f"all: registration corrupt ({w.corrupt})", "services",
            )
            + _cell("all" if w.locations is None else ", ".join(w.locations), "locations")
            + _cell(w.host, "host")
            + _cell(w.pid or None, "pid")
            + _cell(_lease_text(w, time_source), "lease")
            + _cell("yes" if worker_live(w, time_source) else "no", "alive")
            + "</tr>"
        )
    if len(rows) == 1:
        rows.append('<tr><td colspan="7" class="none">no workers registered</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


@functools.cache
def _mermaid() -> str:
    from locstatus.fsm.diagram import mermaid

    return mermaid()


@functools.cache
def state_diagram_svg() -> str:
    """The state machine as an inline SVG, drawn from :data:`locstatus.fsm.table.TRANSITIONS`:
    states on a circle in table order, one arrow per (source, destination) pair labelled with
    its events, internal transitions (``dest: None``) listed under their state."""
    states = list(table.STATES)
    n = len(states)
    width, height, bw, bh = 640, 400, 110, 36
    cx, cy, rx, ry = width / 2, height / 2 - 10, 210, 120
    pos: dict[str, tuple[float, float]] = {}
    for i, s in enumerate(states):  # first state top-left, clockwise
        angle = math.pi + math.pi / 4 + 2 * math.pi * i / n
        pos[s] = (
            cx + rx * math.cos(angle) * math.sqrt(2),
            cy + ry * math.sin(angle) * math.sqrt(2),
        )
    edges: dict[tuple[str, str], list[str]] = {}
    internal: dict[str, list[str]] = {}
    for t in table.TRANSITIONS:
        sources = t["source"] if isinstance(t["source"], list) else [t["source"]]
        for src in sources:
            if t["dest"] is None:
                internal.setdefault(src, []).append(t["trigger"])
            else:
                edges.setdefault((src, t["dest"]), []).append(t["trigger"])

    def clip(x: float, y: float, dx: float, dy: float) -> tuple[float, float]:
        scale = min(
            (bw / 2 + 4) / abs(dx) if dx else math.inf, (bh / 2 + 4) / abs(dy) if dy else math.inf
        )
        return x + dx * scale, y + dy * scale

    out = [
        f'<svg id="fsm" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="state machine">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/>'
        "</marker></defs>",
    ]
    for (src, dst), triggers in sorted(edges.items()):
        (x1, y1), (x2, y2) = pos[src], pos[dst]
        dx, dy = x2 - x1, y2 - y1
        length = math.hypot(dx, dy) or 1.0
        off = 7.0 if (dst, src) in edges else 0.0  # two-way pairs: two parallel arrows
        ox, oy = -dy / length * off, dx / length * off
        sx, sy = clip(x1 + ox, y1 + oy, dx, dy)
        ex, ey = clip(x2 + ox, y2 + oy, -dx, -dy)
        # Label a third of the way from the source, pushed to the arrow's side.
        lx = sx + (ex - sx) * 0.33 + ox * 2.2
        ly = sy + (ey - sy) * 0.33 + oy * 2.2
        label = " | ".join(dict.fromkeys(triggers))
        out.append(
            f'<line class="edge" data-from="{src}" data-to="{dst}" x1="{sx:.1f}" y1="{sy:.1f}" '
            f'x2="{ex:.1f}" y2="{ey:.1f}" stroke="#555" marker-end="url(#arrow)"/>'
            f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle" fill="#114">{_e(label)}</text>'
        )
    for s in states:
        x, y = pos[s]
        fill = {"running": "#e6f6e6", "paused": "#fde8e8"}.get(s, "#fff4d6")
        initial = ' stroke-width="2.5"' if s == table.INITIAL else ""
        out.append(
            f'<g class="state" data-state="{s}"><rect x="{x - bw / 2:.1f}" y="{y - bh / 2:.1f}" '
            f'width="{bw}" height="{bh}" rx="8" fill="{fill}" stroke="#333"{initial}/>'
            f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" font-weight="bold">{s}</text>'
        )
        # Internal transitions, one per line, away from the centre.
        for k, trigger in enumerate(dict.fromkeys(internal.get(s, []))):
            ty = y + bh / 2 + 16 + 14 * k if y > cy else y - bh / 2 - 8 - 14 * k
            out.append(
                f'<text x="{x:.1f}" y="{ty:.1f}" text-anchor="middle" fill="#666">'
                f"&#x21bb; {_e(trigger)}</text>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
