import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseEvents } from '../src/sse.js';

async function collect(chunks) {
  const body = (async function* () {
    for (const c of chunks) yield new TextEncoder().encode(c);
  })();
  const out = [];
  for await (const e of parseEvents(body)) out.push(e);
  return out;
}

test('events split across chunks, CRLF and CR line ends, comments, multi-line data', async () => {
  const events = await collect([
    ': ping\r\nid: a-1\r\nevent: snap', 'shot\r\ndata: {"x"\r\ndata: :1}\r\n\r',
    '\nevent: heartbeat\rdata: {}\r\rid: a-2\nevent: location\ndata:  two spaces\n\n',
  ]);
  assert.deepEqual(events, [
    { event: 'snapshot', id: 'a-1', data: '{"x"\n:1}' },
    { event: 'heartbeat', id: null, data: '{}' },
    { event: 'location', id: 'a-2', data: ' two spaces' },
  ]);
});

test('an unfinished event at the end of the stream is not dispatched', async () => {
  const events = await collect(['event: location\ndata: {}\n']);
  assert.deepEqual(events, []);
});
