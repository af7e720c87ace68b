// The Node worker against a real sidecar on a real store (LOCSTATUS_TEST_BACKEND: SQLite or
// ZooKeeper), beside Python agents: the scenarios of docs/http.md "Workers over HTTP".

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeEach, test } from 'node:test';

import { Worker } from '../src/index.js';
import {
  TcpProxy, cliWorkers, freePort, freshBackend, getJson, post, python, seed, sleep,
  startPythonWorker, startSidecar, stateOf, track, waitFor,
} from './harness.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
let backend;
let sidecar;
const cleanups = [];

beforeEach(async () => {
  backend = freshBackend();
  await seed(backend);
  sidecar = await startSidecar(backend);
});

afterEach(async () => {
  while (cleanups.length) {
    try { await cleanups.pop()(); } catch { /* already gone */ }
  }
  await sidecar.stop();
});

function worker(opts) {
  const w = new Worker({ url: sidecar.url, services: ['replication'], heartbeatSeconds: 1,
    retry: { base: 0.1, cap: 0.5 }, ...opts });
  cleanups.push(() => w.stop());
  return w;
}

function gate() {
  let open;
  const p = new Promise((r) => { open = r; });
  return { wait: () => p, open };
}

test('a Node worker and a Python worker on one location hold pausing until both acknowledged',
  async () => {
    const py = startPythonWorker(backend, 'py-1', { lease: 3 });
    cleanups.push(() => py.stop());
    const g = gate();
    const calls = [];
    const w = worker({
      workerId: 'node-1',
      onPause: async (loc) => { calls.push(`pause ${loc}`); await g.wait(); },
      onResume: (loc) => { calls.push(`resume ${loc}`); },
    });
    await w.start();
    await waitFor(() => py.lines().some((l) => l.event === 'ready'), { what: 'python agent' });
    await waitFor(async () => (await getJson(sidecar.url, '/v1/workers')).length === 2,
      { what: 'both workers registered' });
    await waitFor(() => calls.includes('resume us-east-1'), { what: 'onResume on start' });
    await post(sidecar.url, '/v1/locations/us-east-1/replication/pause');
    await waitFor(() => py.lines().some((l) => l.event === 'pause' && l.phase === 'end'),
      { what: 'python on_pause' });
    await waitFor(() => calls.includes('pause us-east-1'), { what: 'node onPause' });
    await sleep(1500); // the Python agent acknowledged, the Node handler has not returned
    assert.equal(await stateOf(sidecar.url, 'us-east-1'), 'pausing');
    assert.equal(w.isPaused('us-east-1', 'replication'), true);
    g.open();
    await waitFor(async () => (await stateOf(sidecar.url, 'us-east-1')) === 'paused',
      { what: 'paused once both acknowledged' });
    assert.equal(w.observedGeneration('us-east-1', 'replication'), 1);
  });

test('a Node worker killed -9 stops blocking when its lease lapses', async () => {
  const lease = 3;
  const child = track(spawn(process.execPath,
    [path.join(HERE, 'fixtures/worker.js'), sidecar.url, 'node-doomed', String(lease)]));
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  cleanups.push(async () => { if (child.exitCode === null) child.kill('SIGKILL'); });
  await waitFor(() => out.includes('ready'), { what: 'child worker ready' });
  await post(sidecar.url, '/v1/locations/us-east-1/replication/pause');
  await sleep(1000);
  assert.equal(await stateOf(sidecar.url, 'us-east-1'), 'pausing'); // its onPause never returns
  const killed = Date.now();
  child.kill('SIGKILL');
  await once(child, 'exit');
  await waitFor(async () => (await stateOf(sidecar.url, 'us-east-1')) === 'paused',
    { timeout: (lease + 10) * 1000, what: 'settled once the lease lapsed' });
  const waited = (Date.now() - killed) / 1000;
  assert.ok(waited < lease + 5, `settled ${waited}s after the kill (lease ${lease}s)`);
});

test('a Node worker whose stream is cut through a proxy converges', async () => {
  const proxy = await new TcpProxy(sidecar.url.replace('http://', '')).listen();
  cleanups.push(() => proxy.close());
  const seen = [];
  const w = new Worker({
    url: proxy.url, workerId: 'node-cut', services: ['replication'], heartbeatSeconds: 1,
    leaseSeconds: 10, onPause: (loc) => { seen.push(`pause ${loc}`); },
    onResume: (loc) => { seen.push(`resume ${loc}`); },
  });
  cleanups.push(() => w.stop());
  await w.start();
  await waitFor(() => seen.includes('resume eu-west-1'), { what: 'started' });
  proxy.hold(); // every connection reset, new ones refused: the stream is gone
  await post(sidecar.url, '/v1/locations/eu-west-1/replication/pause');
  await post(sidecar.url, '/v1/locations/us-east-1/replication/pause');
  await sleep(1500);
  assert.equal(await stateOf(sidecar.url, 'eu-west-1'), 'pausing');
  proxy.release();
  await waitFor(async () => (await stateOf(sidecar.url, 'eu-west-1')) === 'paused' &&
    (await stateOf(sidecar.url, 'us-east-1')) === 'paused', { what: 'converged after the cut' });
  assert.ok(w.metrics.reconnects >= 1, JSON.stringify(w.metrics));
  proxy.cut(); // a plain cut (the client reconnects at once, resuming with Last-Event-ID)
  await post(sidecar.url, '/v1/locations/eu-west-1/replication/resume');
  await waitFor(async () => (await stateOf(sidecar.url, 'eu-west-1')) === 'running',
    { what: 'resume applied after the second cut' });
  assert.equal(w.isPaused('eu-west-1', 'replication'), false);
});

test('a handler that throws is retried and its error shows in locstatus workers', async () => {
  let failures = 3;
  const w = worker({
    workerId: 'node-flaky',
    onPause: (loc) => {
      if (loc === 'us-east-1' && failures > 0) {
        failures -= 1;
        throw new Error('disk on fire');
      }
    },
  });
  await w.start();
  // slow the retries so the published error can be seen
  w.retry = { base: 1, cap: 1 };
  await post(sidecar.url, '/v1/locations/us-east-1/replication/pause');
  const shown = await waitFor(async () => {
    const ws = await cliWorkers(backend);
    const me = ws.find((x) => x.worker_id === 'node-flaky');
    return me?.errors?.['us-east-1/replication'];
  }, { what: 'the error in locstatus workers' });
  assert.match(shown, /disk on fire/);
  await waitFor(async () => (await stateOf(sidecar.url, 'us-east-1')) === 'paused',
    { what: 'paused once the handler succeeded' });
  assert.equal(failures, 0);
  await waitFor(async () => {
    const me = (await cliWorkers(backend)).find((x) => x.worker_id === 'node-flaky');
    return me && Object.keys(me.errors).length === 0;
  }, { what: 'the error cleared' });
});

test('a pause while onResume runs: the handler runs again and only the newer state is acked',
  async () => {
    const calls = [];
    const g = gate();
    const w = worker({
      workerId: 'node-slow',
      locations: ['us-east-1'],
      onResume: async (loc, svc, st) => { calls.push(`resume ${st.generation}`); await g.wait(); },
      onPause: (loc, svc, st) => { calls.push(`pause ${st.generation}`); },
    });
    await w.start();
    await waitFor(() => calls.includes('resume 0'), { what: 'onResume on start' });
    await post(sidecar.url, '/v1/locations/us-east-1/replication/pause');
    await sleep(500);
    g.open();
    await waitFor(async () => (await stateOf(sidecar.url, 'us-east-1')) === 'paused',
      { what: 'paused' });
    assert.deepEqual(calls, ['resume 0', 'pause 1']);
    assert.equal(w.observedGeneration('us-east-1', 'replication'), 1);
  });

test('a removal runs onRemove and is acknowledged; a sidecar restart makes the worker re-list',
  async () => {
    const removed = [];
    const port = await freePort();
    await sidecar.stop();
    sidecar = await startSidecar(backend, { port });
    const w = worker({ workerId: 'node-rm', onRemove: (loc) => { removed.push(loc); } });
    await w.start();
    await waitFor(() => w.records.size === 2, { what: 'snapshot' });
    await sidecar.stop();
    await python(
      'import sys\nfrom locstatus import connect\nm = connect(sys.argv[1])\n' +
      'm.remove_location("eu-west-1")\nm.close()', backend);
    sidecar = await startSidecar(backend, { port }); // a new feed: the old cursor is stale
    await waitFor(() => removed.includes('eu-west-1'), { what: 'onRemove after re-list' });
    assert.ok(w.metrics.relists >= 1, JSON.stringify(w.metrics));
    await waitFor(async () => {
      const a = JSON.parse(await python(
        'import sys, json\nfrom locstatus import connect\nm = connect(sys.argv[1])\n' +
        'print(json.dumps(m.backend.acks("eu-west-1")))\nm.close()', backend));
      return a['node-rm']?._tombstone > 0;
    }, { what: 'tombstone acknowledged' });
    assert.deepEqual(removed, ['eu-west-1']);
  });

test('a worker cut off past its lease fences itself, and comes back from a fresh read',
  async () => {
    const proxy = await new TcpProxy(sidecar.url.replace('http://', '')).listen();
    cleanups.push(() => proxy.close());
    const calls = [];
    const w = new Worker({
      url: proxy.url, workerId: 'node-fence', services: ['replication'], heartbeatSeconds: 1,
      leaseSeconds: 3, locations: ['us-east-1'],
      onPause: (loc, svc, st) => { calls.push(`pause ${st.generation}`); },
      onResume: (loc, svc, st) => { calls.push(`resume ${st.generation}`); },
      onFence: () => { calls.push('fence'); },
    });
    cleanups.push(() => w.stop());
    await w.start();
    await waitFor(() => calls.includes('resume 0'), { what: 'started' });
    proxy.hold();
    await waitFor(() => calls.includes('fence'), { timeout: 5000, what: 'self-fence' });
    assert.equal(w.fenced, true);
    // the operator pauses; once the lease lapsed on the backend's time it settles without us
    await post(sidecar.url, '/v1/locations/us-east-1/replication/pause');
    await waitFor(async () => (await stateOf(sidecar.url, 'us-east-1')) === 'paused',
      { timeout: 10000, what: 'settled without the fenced worker' });
    assert.deepEqual(calls, ['resume 0', 'fence']); // nothing ran against the pause meanwhile
    proxy.release();
    await waitFor(() => !w.fenced && w.observedGeneration('us-east-1', 'replication') === 1,
      { what: 'back, with the pause applied and acknowledged' });
    assert.deepEqual(calls, ['resume 0', 'fence', 'pause 1']);
    assert.equal(w.metrics.fences, 1);
  });

test('start() keeps trying to register until the sidecar answers', async () => {
  const port = await freePort();
  await sidecar.stop();
  const w = new Worker({ url: `http://127.0.0.1:${port}`, workerId: 'node-early',
    services: ['replication'], heartbeatSeconds: 1, startTimeoutMs: 30000 });
  cleanups.push(() => w.stop());
  const started = w.start();
  await sleep(1000); // refused connections meanwhile
  sidecar = await startSidecar(backend, { port });
  await started;
  await waitFor(async () => (await getJson(sidecar.url, '/v1/workers'))
    .some((x) => x.worker_id === 'node-early'), { what: 'registered' });
});
