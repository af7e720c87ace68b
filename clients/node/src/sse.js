// A Server-Sent Events parser over a WHATWG ReadableStream of bytes (the body of Node's global
// fetch), per the HTML specification's "event stream interpretation": lines end with LF, CR or
// CRLF; `field: value` with one optional space; a blank line dispatches; comments start with
// ':'. It yields {event, id, data} objects; `id` is null when the event carried none.

export async function* parseEvents(body) {
  const decoder = new TextDecoder();
  let buffer = '';
  let fields = { event: '', data: [], id: null };
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    let start = 0;
    for (;;) {
      const m = /\r\n|\r|\n/.exec(buffer.slice(start));
      if (m === null) break;
      // A CR at the very end may be the first half of a CRLF still in flight.
      if (m[0] === '\r' && start + m.index + 1 === buffer.length) break;
      const line = buffer.slice(start, start + m.index);
      start += m.index + m[0].length;
      if (line === '') {
        if (fields.data.length > 0 || fields.event !== '') {
          yield { event: fields.event || 'message', id: fields.id, data: fields.data.join('\n') };
        }
        fields = { event: '', data: [], id: null };
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const name = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (name === 'event') fields.event = value;
      else if (name === 'data') fields.data.push(value);
      else if (name === 'id' && !value.includes('\0')) fields.id = value;
    }
    buffer = buffer.slice(start);
  }
}
