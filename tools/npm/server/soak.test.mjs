// A bounded soak: 200 requests from 32 clients, streamed or not, about a third of them abandoned
// at a random moment. Zero crashes, no 5xx, and at the end no running request and no leaked block.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, waitForMetrics } from './harness.mjs';

const REQUESTS = 200;
const CLIENTS = 32;
let server;

before(async () => {
  server = await startServer(['--max-seqs', '16', '--max-queue', '64', '-c', '256']);
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

// A small deterministic generator, so that a failure can be replayed.
function rng(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

test('200 requests from 32 clients with random disconnects', async () => {
  const random = rng(20261201);
  let issued = 0;
  const outcome = { ok: 0, aborted: 0, other: [] };
  const client = async () => {
    while (issued < REQUESTS) {
      const i = issued++;
      const stream = random() < 0.5;
      const abandon = random() < 0.35;
      // Abandoning: before the response, abort the fetch; after it, cancel the body's reader.
      // (Aborting a fetch while its body is being read can leave the read pending forever in
      // Node's fetch: nodejs/node#56917, undici#4089.)
      const controller = new AbortController();
      let reader = null;
      let abandoned = false;
      const timer = abandon ? setTimeout(() => {
        abandoned = true;
        if (reader) reader.cancel().catch(() => {});
        else controller.abort();
      }, Math.floor(random() * 400)) : null;
      const body = {
        model: 'any', temperature: random() < 0.5 ? 0 : 1, seed: i, max_tokens: 4 + Math.floor(random() * 8), ignore_eos: random() < 0.5,
        stream, ...(i % 2 ? { prompt: `Request ${i}: and it came to pass` } : { messages: [{ role: 'user', content: `Request ${i}` }] }),
      };
      try {
        const res = await fetch(`${server.url}/v1/${i % 2 ? 'completions' : 'chat/completions'}`, {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: controller.signal,
        });
        reader = res.body.getReader();
        const decoder = new TextDecoder();
        let text = '';
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          text += decoder.decode(value, { stream: true });
        }
        if (abandoned) outcome.aborted++;
        else if (res.status !== 200) outcome.other.push(`${res.status} ${text}`);
        else if (stream ? !text.endsWith('data: [DONE]\n\n') : !JSON.parse(text).usage) outcome.other.push(`incomplete: ${text}`);
        else outcome.ok++;
      } catch (e) {
        if (e.name !== 'AbortError' && !abandoned) outcome.other.push(String(e));
        else outcome.aborted++;
      } finally {
        clearTimeout(timer);
      }
    }
  };
  await Promise.all(Array.from({ length: CLIENTS }, client));
  assert.deepEqual(outcome.other, []);
  assert.equal(outcome.ok + outcome.aborted, REQUESTS);
  console.log(`soak: ${outcome.ok} complete, ${outcome.aborted} abandoned by the client`);
  assert.ok(outcome.aborted > 20, `${outcome.aborted} aborted`);
  assert.ok(server.alive(), 'the server did not crash');
  await waitForMetrics(server.url, (m) => m.minfer_requests_running === 0 && m.minfer_requests_waiting === 0 && m.minfer_kv_blocks_used === 0);
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
});
