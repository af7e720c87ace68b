// Test harness: real sidecars (`locstatus serve`) on a real store, Python agents and Node
// workers as OS processes, and a TCP proxy that can cut connections.
//
// Environment:
//   LOCSTATUS_PYTHON        the Python with locstatus installed (default: python3)
//   LOCSTATUS_TEST_BACKEND  "sqlite" (default: a fresh file per test) or "zk:<host:port,...>"
//                           (a fresh chroot per test on that ZooKeeper)

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, existsSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const PYTHON = process.env.LOCSTATUS_PYTHON ?? 'python3';
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const LOCATIONS = ['eu-west-1', 'us-east-1'];
const children = new Set();

process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});

export function freshBackend() {
  const spec = process.env.LOCSTATUS_TEST_BACKEND ?? 'sqlite';
  if (spec.startsWith('zk:')) {
    return `zk://${spec.slice(3)}/t-node-${Math.random().toString(16).slice(2, 14)}`;
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'locstatus-node-'));
  return `sqlite:///${dir}/ls.db`;
}

export function track(child) {
  children.add(child);
  child.on('exit', () => children.delete(child));
  return child;
}

/** Run Python code with the backend URL as sys.argv[1]; resolves to its stdout. */
export async function python(code, url, ...args) {
  const child = track(spawn(PYTHON, ['-c', code, url, ...args], { cwd: REPO }));
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { err += d; });
  const [code_] = await once(child, 'exit');
  if (code_ !== 0) throw new Error(`python failed (${code_}): ${err}`);
  return out;
}

export async function seed(url) {
  await python(
    'import sys\nfrom locstatus import connect\nm = connect(sys.argv[1])\n' +
    `m.sync_locations(${JSON.stringify(LOCATIONS)})\nm.close()`, url);
}

/** `locstatus workers --json` against the store. */
export async function cliWorkers(url) {
  const child = track(spawn(PYTHON, ['-m', 'locstatus', 'workers', '--json'], {
    cwd: REPO, env: { ...process.env, LOCSTATUS_BACKEND: url },
  }));
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  await once(child, 'exit');
  return JSON.parse(out);
}

export async function freePort() {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

/** A sidecar process on `url`; resolves once it serves. */
export async function startSidecar(url, { port = 0, env = {} } = {}) {
  const child = track(spawn(PYTHON, ['-m', 'locstatus', 'serve', '--port', String(port),
    '--reconcile-interval', '0.5'], {
    cwd: REPO, env: { ...process.env, LOCSTATUS_BACKEND: url, ...env },
  }));
  let log = '';
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`sidecar did not start: ${log}`)), 30000);
    const onData = (d) => {
      log += d;
      const m = /locstatus sidecar on (http:\/\/[^\s,]+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    };
    child.stderr.on('data', onData);
    child.stdout.on('data', onData);
    child.on('exit', (c) => { clearTimeout(timer); reject(new Error(`sidecar exited ${c}: ${log}`)); });
  });
  for (let i = 0; i < 200; i++) {
    try {
      const r = await fetch(`${base}/healthz`);
      if (r.ok) break;
    } catch { /* not yet */ }
    await sleep(50);
  }
  return {
    url: base,
    child,
    log: () => log,
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10000);
      await once(child, 'exit');
      clearTimeout(timer);
    },
  };
}

/** A Python agent (tests/support/agent_worker.py) recording its handler calls. */
export function startPythonWorker(url, id, { lease = 3 } = {}) {
  const dir = mkdtempSync(path.join(tmpdir(), 'locstatus-py-'));
  const record = path.join(dir, 'record.jsonl');
  const child = track(spawn(PYTHON, [path.join(REPO, 'tests/support/agent_worker.py'),
    '--url', url, '--id', id, '--record', record, '--lease', String(lease)], { cwd: REPO }));
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  return {
    child,
    stderr: () => err,
    lines() {
      if (!existsSync(record)) return [];
      return readFileSync(record, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
    },
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10000);
      await once(child, 'exit');
      clearTimeout(timer);
    },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(pred, { timeout = 20000, what = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(50);
  }
}

export async function getJson(base, p) {
  const r = await fetch(base + p);
  if (!r.ok) throw new Error(`GET ${p}: ${r.status} ${await r.text()}`);
  return r.json();
}

export async function post(base, p, body = {}) {
  const r = await fetch(base + p, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`POST ${p}: ${r.status} ${await r.text()}`);
  return r.json();
}

export async function stateOf(base, loc, svc = 'replication') {
  const rec = await getJson(base, `/v1/locations/${loc}`);
  return rec.services[svc].state;
}

/** A TCP proxy to `target` (host:port): cut() resets every connection, hold() refuses new
 * ones until release(). */
export class TcpProxy {
  constructor(target) {
    const [host, port] = target.split(':');
    this.sockets = new Set();
    this.holding = false;
    this.server = net.createServer((client) => {
      if (this.holding) { client.destroy(); return; }
      const upstream = net.connect(Number(port), host);
      this.sockets.add(client);
      this.sockets.add(upstream);
      const drop = () => {
        client.destroy();
        upstream.destroy();
        this.sockets.delete(client);
        this.sockets.delete(upstream);
      };
      client.on('error', drop).on('close', drop);
      upstream.on('error', drop).on('close', drop);
      client.pipe(upstream);
      upstream.pipe(client);
    });
  }

  async listen() {
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    this.url = `http://127.0.0.1:${this.server.address().port}`;
    return this;
  }

  cut() {
    for (const s of this.sockets) s.resetAndDestroy ? s.resetAndDestroy() : s.destroy();
    this.sockets.clear();
  }

  hold() { this.holding = true; this.cut(); }

  release() { this.holding = false; }

  async close() {
    this.cut();
    this.server.close();
  }
}
