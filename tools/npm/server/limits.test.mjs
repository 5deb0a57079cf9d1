// The server's limits: --timeout ends a request with what it generated and finish_reason
// "length", streamed or not; a full queue (--max-seqs + --max-queue sequences) answers 429 with
// Retry-After.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, waitForMetrics } from './harness.mjs';

let server;
before(async () => {
  server = await startServer(['--timeout', '1', '-c', '2048', '--max-seqs', '2', '--max-queue', '1']);
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

test('a request past --timeout ends with finish_reason length', async () => {
  const body = { prompt: 'And it came to pass', max_tokens: 2000, ignore_eos: true, temperature: 0 };
  const started = Date.now();
  const res = await fetch(`${server.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body) });
  const reply = await res.json();
  assert.equal(res.status, 200);
  assert.equal(reply.choices[0].finish_reason, 'length');
  assert.ok(reply.usage.completion_tokens > 0 && reply.usage.completion_tokens < 2000, `${reply.usage.completion_tokens} tokens`);
  assert.ok(Date.now() - started < 10_000);
  const streamed = await fetch(`${server.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ ...body, stream: true }) });
  const text = await streamed.text();
  assert.match(text, /"finish_reason":"length"/);
  assert.ok(text.endsWith('data: [DONE]\n\n'));
  await waitForMetrics(server.url, (m) => m.minfer_requests_running === 0 && m.minfer_kv_blocks_used === 0, 10_000);
});

test('a full queue answers 429 with Retry-After', async () => {
  const body = JSON.stringify({ prompt: 'And it came to pass', max_tokens: 2000, ignore_eos: true, stream: true });
  const open = [];
  for (let i = 0; i < 3; i++) {  // 2 running + 1 waiting fill it
    open.push(await fetch(`${server.url}/v1/completions`, { method: 'POST', body }));
  }
  const refused = await fetch(`${server.url}/v1/completions`, { method: 'POST', body });
  assert.equal(refused.status, 429);
  assert.equal(refused.headers.get('retry-after'), '1');
  assert.equal((await refused.json()).error.code, 'queue_full');
  for (const r of open) {
    assert.equal(r.status, 200);
    assert.match(await r.text(), /data: \[DONE\]/);  // each ends at the 1 s timeout
  }
  await waitForMetrics(server.url, (m) => m.minfer_requests_running === 0 && m.minfer_kv_blocks_used === 0, 10_000);
});
