// locstatus worker client for Node.js (>= 18; no runtime dependencies: the global fetch,
// WHATWG streams, timers). It runs the worker protocol of the locstatus sidecar
// (docs/http.md "Workers over HTTP") with the semantics of the Python agent (docs/agent.md):
//
// - register, and renew the lease every third of it; judge the lease on the monotonic clock
//   only and self-fence (run onFence, else onPause, for what runs; start nothing, acknowledge
//   nothing) once the last renewal that succeeded was sent more than
//   lease - fence margin - the sidecar's uncertainty ago;
// - watch: apply the snapshot, then every change; resume with Last-Event-ID, re-list on a
//   410, reconnect with jittered backoff, treat a stream with no event for three heartbeats
//   as dead;
// - per location and service: run the handler for the state read, then acknowledge the
//   generation applied on the condition that the record is still at the version read; a 409
//   carries the newer record: a moved generation runs the handler again, the same one is
//   acknowledged again; a handler that throws is retried with backoff and its error is
//   published in the registration (`locstatus workers`);
// - removals: onRemove once, then the tombstone is acknowledged; a location that disappears
//   after it was applied gets onRemove too.
//
// Handlers of one location run one at a time; different locations run concurrently.

import { parseEvents } from './sse.js';

const PAUSED = new Set(['pausing', 'paused']);

/** Jittered exponential backoff in seconds: attempt 0, 1, 2 ... */
export function backoff(attempt, base = 0.2, cap = 30) {
  const raw = Math.min(cap, base * 2 ** Math.min(attempt, 30));
  return raw * (0.5 + Math.random() / 2);
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

export class HttpError extends Error {
  constructor(status, problem) {
    super(`${status} ${problem?.title ?? ''}: ${problem?.detail ?? ''}`.trim());
    this.status = status;
    this.problem = problem ?? {};
  }
}

export class Worker {
  /**
   * @param {object} o
   * @param {string} o.url         sidecar base URL, e.g. http://127.0.0.1:8080
   * @param {string} o.workerId    worker id (location-name rules)
   * @param {string[]} o.services  services applied (crr = replication)
   * @param {string[]} [o.locations] location filter (default: every location)
   * @param {number} [o.leaseSeconds=10]
   * @param {string} [o.token]     bearer token (a worker principal's)
   * @param {(loc: string, svc: string, status: object) => any} [o.onPause]
   * @param {(loc: string, svc: string, status: object) => any} [o.onResume]
   * @param {(loc: string) => any} [o.onRemove]
   * @param {(loc: string, svc: string, status: object) => any} [o.onFence]
   * @param {{base?: number, cap?: number}} [o.retry] handler retry backoff (seconds)
   * @param {number} [o.heartbeatSeconds=5] heartbeat interval asked of the stream
   * @param {number} [o.startTimeoutMs=30000] how long start() retries the registration
   * @param {(msg: string) => void} [o.log]
   */
  constructor(o) {
    if (!o?.url || !o.workerId || !Array.isArray(o.services) || o.services.length === 0) {
      throw new TypeError('Worker needs url, workerId and a non-empty services list');
    }
    this.url = o.url.replace(/\/+$/, '');
    this.workerId = o.workerId;
    this.services = o.services.map((s) => (s === 'crr' ? 'replication' : s));
    this.locations = o.locations ?? null;
    this.leaseSeconds = o.leaseSeconds ?? 10;
    this.token = o.token ?? null;
    this.handlers = { pause: o.onPause, resume: o.onResume, remove: o.onRemove, fence: o.onFence };
    this.retry = { base: o.retry?.base ?? 0.2, cap: o.retry?.cap ?? 30 };
    this.heartbeatSeconds = o.heartbeatSeconds ?? 5;
    this.startTimeoutMs = o.startTimeoutMs ?? 30000;
    this.log = o.log ?? (() => {});

    this.records = new Map(); // loc -> {record, removed, removeGeneration}
    this.applied = new Map(); // "loc/svc" -> generation acknowledged
    this.handled = new Map(); // "loc/svc" -> generation whose handler returned
    this.running = new Set(); // "loc/svc" whose onResume returned last
    this.touched = new Set(); // locations where a handler ran (purge detection)
    this.removeHandled = new Map(); // loc -> remove generation whose onRemove returned
    this.removeAcked = new Map(); // loc -> remove generation acknowledged
    this.errorMap = new Map(); // "loc/svc" -> message
    this.retries = new Map(); // "loc/svc" -> {attempt, due (ms, monotonic), generation}
    this.busy = new Set();
    this.dirty = new Set();
    this.inflight = new Set();
    this.cursor = null;
    this.fenced = false;
    this.fenceWork = null;
    this.relistAfterFence = false;
    this.relistPending = false;
    this.goodUntil = 0;
    this.started = false;
    this.stopping = false;
    this.stopController = new AbortController();
    this.metrics = {
      handlerRuns: 0, handlerErrors: 0, handlerReruns: 0, acks: 0, ackConflicts: 0,
      renewals: 0, renewalErrors: 0, reconnects: 0, relists: 0, fences: 0, events: 0,
    };
  }

  // -- public --------------------------------------------------------------------------

  /** Register, then watch and apply until stop(). Resolves once registered. */
  async start() {
    if (this.started) return this;
    this.started = true;
    // A sidecar busy with a fleet starting at once may answer late: retry the registration
    // (not a refusal: a 4xx is thrown at once) for up to startTimeoutMs.
    const deadline = performance.now() + this.startTimeoutMs;
    for (let attempt = 0; ; attempt++) {
      try {
        await this.#renewOrThrow();
        break;
      } catch (e) {
        const refused = e instanceof HttpError && e.status < 500 && e.status !== 429;
        if (refused || performance.now() > deadline) throw e;
        this.log(`registration failed, retrying: ${e.message}`);
        await sleep(backoff(attempt, 0.2, 2) * 1000);
      }
    }
    this.#beatLoop();
    this.guard = setInterval(() => this.#checkLease(), 50);
    this.streamDone = this.#streamLoop();
    return this;
  }

  /** Stop: no more handlers start; unregister (at most `timeoutMs` waiting for the sidecar). */
  async stop(timeoutMs = 2000) {
    if (this.stopping) return;
    this.stopping = true;
    this.stopController.abort();
    clearInterval(this.guard);
    clearTimeout(this.beatTimer);
    for (const r of this.retries.values()) clearTimeout(r.timer);
    this.streamAbort?.abort();
    await Promise.race([Promise.allSettled([...this.inflight]), sleep(timeoutMs)]);
    try {
      await this.#request('DELETE', `/v1/workers/${encodeURIComponent(this.workerId)}`, undefined,
        timeoutMs);
    } catch (e) {
      this.log(`unregister failed (the lease ends it): ${e.message}`);
    }
    await Promise.race([this.streamDone, sleep(timeoutMs)]);
  }

  /** Desired state paused (pausing/paused) or removed; throws for an unknown location. */
  isPaused(location, service) {
    const e = this.records.get(location);
    if (!e) throw new Error(`location ${location} is not known to worker ${this.workerId}`);
    if (e.removed) return true;
    const st = e.record.services[service === 'crr' ? 'replication' : service];
    return st ? PAUSED.has(st.state) : false;
  }

  /** Generation acknowledged for (location, service), or null. */
  observedGeneration(location, service) {
    return this.applied.get(`${location}/${service}`) ?? null;
  }

  /** Failing handlers: {"loc/svc": message}. */
  errors() {
    return Object.fromEntries(this.errorMap);
  }

  // -- HTTP ------------------------------------------------------------------------------

  #headers(extra = {}) {
    const h = { 'Content-Type': 'application/json', ...extra };
    if (this.token) h.Authorization = `Bearer ${this.token}`;
    return h;
  }

  async #request(method, path, body, timeoutMs = 10000) {
    const res = await fetch(this.url + path, {
      method,
      headers: this.#headers(),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    const data = text ? JSON.parse(text) : null;
    if (!res.ok) throw new HttpError(res.status, data);
    return data;
  }

  // -- lease -----------------------------------------------------------------------------

  async #renewOrThrow() {
    const sent = performance.now();
    const lease = await this.#request('PUT', `/v1/workers/${encodeURIComponent(this.workerId)}`, {
      services: this.services,
      locations: this.locations,
      lease_seconds: this.leaseSeconds,
      host: process.env.HOSTNAME ?? '',
      pid: process.pid,
      errors: this.errors(),
    }, Math.max(1000, this.leaseSeconds * 500));
    const holds = lease.lease_seconds - lease.fence_margin_seconds - lease.uncertainty_seconds;
    this.goodUntil = sent + holds * 1000;
    this.renewEvery = lease.renew_every_seconds * 1000;
    this.metrics.renewals += 1;
    if (this.fenced && !this.relistPending) {
      // Back: lift the fence only after its handlers returned and every record was read
      // again since the lease holds (docs/agent.md "Self-fencing"). Asked again after each
      // renewal until it happens (a snapshot that came while the lease did not hold yet
      // does not lift it).
      this.relistAfterFence = true;
      this.relistPending = true;
      this.#relist();
    }
  }

  #beatLoop() {
    if (this.stopping) return;
    this.beatTimer = setTimeout(async () => {
      try {
        await this.#renewOrThrow();
      } catch (e) {
        this.metrics.renewalErrors += 1;
        this.log(`renewal failed: ${e.message}`);
      }
      this.#beatLoop();
    }, this.renewEvery ?? (this.leaseSeconds * 1000) / 3);
  }

  #beatSoon() {
    if (this.stopping || this.beatingSoon) return;
    this.beatingSoon = true;
    clearTimeout(this.beatTimer);
    setTimeout(() => { this.beatingSoon = false; this.#beatLoop(); }, 0);
    // #beatLoop waits a full interval: renew now, then go on as usual
    this.#renewOrThrow().catch((e) => {
      this.metrics.renewalErrors += 1;
      this.log(`renewal failed: ${e.message}`);
    });
  }

  #checkLease() {
    if (!this.fenced && !this.stopping && performance.now() > this.goodUntil) {
      this.#fence('the lease may have lapsed');
    }
  }

  #fence(why) {
    if (this.fenced) return;
    this.fenced = true;
    this.relistAfterFence = false;
    this.relistPending = false;
    this.metrics.fences += 1;
    this.log(`self-fencing: ${why}`);
    const keys = [...this.running];
    this.fenceWork = (async () => {
      for (const key of keys) {
        const [loc, svc] = splitKey(key);
        const st = this.records.get(loc)?.record?.services?.[svc] ?? null;
        const fn = this.handlers.fence ?? this.handlers.pause;
        try {
          await this.#runLocation(loc, () => fn?.(loc, svc, st));
          this.running.delete(key);
        } catch (e) {
          this.#handlerError(key, st?.generation ?? -1, e);
        }
      }
    })();
  }

  async #maybeUnfence() {
    if (!this.fenced || !this.relistAfterFence) return;
    await this.fenceWork;
    if (!this.fenced || performance.now() > this.goodUntil) return;
    this.fenced = false;
    this.relistAfterFence = false;
    this.log('fence lifted');
    // Acknowledge again what was applied (it may have been dropped as expired); run
    // onResume again where the service runs.
    for (const [key, gen] of this.applied) {
      this.handled.set(key, gen);
    }
    this.applied.clear();
    for (const key of [...this.handled.keys()]) {
      const [loc, svc] = splitKey(key);
      const st = this.records.get(loc)?.record?.services?.[svc];
      if (!st || !PAUSED.has(st.state)) this.handled.delete(key);
    }
    for (const loc of this.records.keys()) this.#schedule(loc);
  }

  // -- watch -----------------------------------------------------------------------------

  #relist() {
    this.cursor = null;
    this.streamAbort?.abort();
  }

  async #streamLoop() {
    let attempt = 0;
    const path = `/v1/workers/${encodeURIComponent(this.workerId)}/watch` +
      `?heartbeat=${this.heartbeatSeconds}`;
    while (!this.stopping) {
      const ac = new AbortController();
      this.streamAbort = ac;
      let watchdog = null;
      const arm = () => {
        clearTimeout(watchdog);
        watchdog = setTimeout(() => ac.abort(), (this.heartbeatSeconds * 3 + 1) * 1000);
      };
      try {
        const headers = this.#headers({ Accept: 'text/event-stream' });
        delete headers['Content-Type'];
        if (this.cursor) headers['Last-Event-ID'] = this.cursor;
        arm();
        const res = await fetch(this.url + path, { headers, signal: ac.signal });
        if (res.status === 410) {
          await res.body?.cancel();
          this.metrics.relists += 1;
          this.cursor = null;
          continue;
        }
        if (res.status === 404) {
          await res.body?.cancel();
          await this.#renewOrThrow(); // registration gone (lapsed and removed): register again
          throw new Error('not registered');
        }
        if (!res.ok) {
          const text = await res.text();
          throw new HttpError(res.status, text ? JSON.parse(text) : null);
        }
        for await (const ev of parseEvents(res.body)) {
          arm();
          attempt = 0;
          this.#onEvent(ev);
          if (ev.id) this.cursor = ev.id;
        }
      } catch (e) {
        if (this.stopping) break;
        if (!ac.signal.aborted) this.log(`watch failed: ${e.message}`);
      } finally {
        clearTimeout(watchdog);
      }
      if (this.stopping) break;
      this.metrics.reconnects += 1;
      if (!ac.signal.aborted || attempt > 0) {
        await sleep(backoff(attempt, 0.1, 5) * 1000, this.stopController.signal);
      }
      attempt += 1;
    }
  }

  #onEvent(ev) {
    this.metrics.events += 1;
    if (ev.event === 'heartbeat') return;
    const data = ev.data ? JSON.parse(ev.data) : null;
    if (ev.event === 'snapshot') {
      const seen = new Set();
      for (const item of data.records) {
        seen.add(item.location);
        this.#store(item);
      }
      // A corrupt record: keep what was applied, report it (docs/http.md "Workers over HTTP").
      for (const key of [...this.errorMap.keys()]) {
        if (key.endsWith('/*')) this.errorMap.delete(key);
      }
      for (const bad of data.corrupt ?? []) {
        seen.add(bad.location);
        this.errorMap.set(`${bad.location}/*`, `corrupt record: ${bad.detail}`);
      }
      for (const loc of [...this.records.keys()]) {
        if (!seen.has(loc)) this.records.delete(loc); // purged meanwhile
      }
      for (const loc of new Set([...seen, ...this.touched])) this.#schedule(loc);
      this.relistPending = false;
      if (this.relistAfterFence) this.#maybeUnfence();
    } else if (ev.event === 'corrupt') {
      // Nothing is applied from it; the error goes out with the next renewal.
      this.errorMap.set(`${data.location}/*`, `corrupt record: ${data.detail}`);
      this.#beatSoon();
    } else if (ev.event === 'location') {
      if (this.errorMap.delete(`${data.location}/*`)) this.#beatSoon();
      if (data.record === null) this.records.delete(data.location);
      else this.#store(data);
      this.#schedule(data.location);
    } else if (ev.event === 'resync') {
      if (data?.session_lost) {
        // The sidecar's session was replaced: our registration was gone for a while and a
        // pause may have settled without us. Fence, then come back from a fresh read.
        this.#fence('the sidecar lost its backend session');
        this.#beatSoon();
      }
    } else if (ev.event === 'gone') {
      this.streamAbort?.abort(); // reconnect with our cursor (410 then: re-list)
    }
  }

  #store(item) {
    this.records.set(item.location, {
      record: item.record,
      removed: item.removed,
      removeGeneration: item.remove_generation,
      removeService: item.remove_service,
    });
  }

  // -- applying --------------------------------------------------------------------------

  #schedule(loc) {
    if (this.stopping) return;
    if (this.busy.has(loc)) {
      this.dirty.add(loc);
      return;
    }
    this.busy.add(loc);
    const p = this.#apply(loc)
      .catch((e) => this.log(`apply ${loc}: unexpected error: ${e.stack ?? e}`))
      .finally(() => {
        this.busy.delete(loc);
        this.inflight.delete(p);
        if (this.dirty.delete(loc)) this.#schedule(loc);
      });
    this.inflight.add(p);
  }

  // Handlers of one location never overlap: the fence's run through the same queue.
  async #runLocation(loc, fn) {
    while (this.busy.has(loc) && !this.stopping) await sleep(5);
    this.busy.add(loc);
    try {
      return await fn();
    } finally {
      this.busy.delete(loc);
      if (this.dirty.delete(loc)) this.#schedule(loc);
    }
  }

  async #apply(loc) {
    const entry = this.records.get(loc);
    if (!entry) {
      if (this.touched.has(loc)) await this.#removed(loc, null);
      return;
    }
    if (entry.removed) {
      await this.#removed(loc, entry);
      return;
    }
    if (this.fenced) return; // nothing starts, nothing is acknowledged
    for (const svc of this.services) {
      const key = `${loc}/${svc}`;
      const st = entry.record.services[svc];
      if (!st) continue;
      const gen = st.generation;
      if (this.applied.get(key) === gen) continue;
      if (this.handled.get(key) !== gen) {
        const r = this.retries.get(key);
        if (r && r.generation === gen && r.due > performance.now()) continue; // its timer
        const paused = PAUSED.has(st.state);
        const fn = paused ? this.handlers.pause : this.handlers.resume;
        this.metrics.handlerRuns += 1;
        this.touched.add(loc);
        try {
          await fn?.(loc, svc, st);
        } catch (e) {
          this.#handlerError(key, gen, e);
          continue;
        }
        this.#clearRetry(key);
        if (paused) this.running.delete(key);
        else this.running.add(key);
        this.handled.set(key, gen);
        if (this.fenced) return;
        const now = this.records.get(loc);
        if (now?.removed || now?.record?.services?.[svc]?.generation !== gen) {
          this.metrics.handlerReruns += 1;
          this.dirty.add(loc); // moved during the handler: apply the newer state first
          continue;
        }
      }
      await this.#ack(loc, svc, key, gen, this.records.get(loc).record.version);
    }
  }

  async #ack(loc, svc, key, gen, version) {
    try {
      await this.#request('PUT', `/v1/workers/${encodeURIComponent(this.workerId)}/acks/` +
        `${encodeURIComponent(loc)}/${encodeURIComponent(svc)}`,
        { generation: gen, if_version: version });
    } catch (e) {
      if (e instanceof HttpError && e.problem.type === 'urn:locstatus:version-conflict') {
        this.metrics.ackConflicts += 1;
        this.#fresher(loc, e.problem.record);
        this.dirty.add(loc);
        return false;
      }
      if (e instanceof HttpError && e.problem.type === 'urn:locstatus:lease-lapsed') {
        this.#fence('the sidecar says the lease lapsed');
        this.#beatSoon();
        return false;
      }
      this.log(`acknowledge ${key}: ${e.message}; retrying`);
      this.#retryLater(key, gen);
      return false;
    }
    this.metrics.acks += 1;
    this.applied.set(key, gen);
    if (this.errorMap.delete(key)) this.#beatSoon(); // clear the published error now
    return true;
  }

  // A record from a 409: newer than ours unless the stream already brought a newer one.
  #fresher(loc, record) {
    const cur = this.records.get(loc);
    if (record === null || record === undefined) {
      this.records.delete(loc);
      return;
    }
    if (!cur || record.version > cur.record.version || record.deleted_at !== cur.record.deleted_at) {
      this.#store({
        location: loc,
        record,
        removed: record.deleted_at !== null,
        remove_generation: record.deleted_at === null ? null : Date.parse(record.deleted_at),
        remove_service: '_tombstone',
      });
    }
  }

  async #removed(loc, entry) {
    const gen = entry?.removeGeneration ?? null;
    if (gen !== null && this.removeAcked.get(loc) === gen) return;
    if (this.fenced && gen !== null) return;
    const key = `${loc}/_tombstone`;
    if (gen === null || this.removeHandled.get(loc) !== gen) {
      const r = this.retries.get(key);
      if (r && r.due > performance.now()) return;
      this.metrics.handlerRuns += 1;
      try {
        await this.handlers.remove?.(loc);
      } catch (e) {
        this.#handlerError(key, gen ?? 0, e);
        return;
      }
      this.#clearRetry(key);
      for (const svc of this.services) {
        const k = `${loc}/${svc}`;
        this.applied.delete(k);
        this.handled.delete(k);
        this.running.delete(k);
      }
      this.touched.delete(loc);
      if (gen === null) return; // purged: nothing to acknowledge
      this.removeHandled.set(loc, gen);
    }
    try {
      await this.#request('PUT', `/v1/workers/${encodeURIComponent(this.workerId)}/acks/` +
        `${encodeURIComponent(loc)}/${entry.removeService ?? '_tombstone'}`,
        { generation: gen, if_version: entry.record.version });
      this.removeAcked.set(loc, gen);
      if (this.errorMap.delete(key)) this.#beatSoon();
    } catch (e) {
      if (e instanceof HttpError && e.problem.type === 'urn:locstatus:version-conflict') {
        this.#fresher(loc, e.problem.record);
        this.dirty.add(loc);
        return;
      }
      this.#retryLater(key, gen);
    }
  }

  #handlerError(key, gen, e) {
    this.metrics.handlerErrors += 1;
    const message = String(e?.stack ?? e).split('\n')[0].slice(0, 1000);
    this.log(`handler for ${key} failed: ${message}`);
    const had = this.errorMap.get(key);
    this.errorMap.set(key, message);
    if (had !== message) this.#beatSoon(); // publish it now
    this.#retryLater(key, gen);
  }

  #retryLater(key, gen) {
    const prev = this.retries.get(key);
    const attempt = prev && prev.generation === gen ? prev.attempt + 1 : 0;
    clearTimeout(prev?.timer);
    const delay = backoff(attempt, this.retry.base, this.retry.cap) * 1000;
    const [loc] = splitKey(key);
    const entry = { attempt, due: performance.now() + delay, generation: gen, timer: null };
    entry.timer = setTimeout(() => {
      entry.due = 0; // due now, whatever the clocks' granularity says
      this.#schedule(loc);
    }, delay);
    this.retries.set(key, entry);
  }

  #clearRetry(key) {
    const r = this.retries.get(key);
    if (r) clearTimeout(r.timer);
    this.retries.delete(key);
  }
}

function splitKey(key) {
  const i = key.lastIndexOf('/');
  return [key.slice(0, i), key.slice(i + 1)];
}

/** Make a Worker, start it, and resolve to it once registered. */
export async function watch(options) {
  return new Worker(options).start();
}
