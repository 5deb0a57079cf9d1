// minfer serve through the official openai npm client: chat and completions, streaming with
// usage, stop strings, seeds, n, logprobs, concurrent streams, every bad input, auth, an aborted
// stream, and the server healthy at the end. CPU backend, embedded default model, small outputs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metrics, waitForMetrics } from './harness.mjs';

const KEY = 'test-key';
let server;
let client;

before(async () => {
  server = await startServer(['--api-key', KEY, '--max-seqs', '16', '-c', '256']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
});
after(async () => {
  assert.equal(await server.stop(), 0, 'minfer serve exits cleanly on SIGTERM');
});

const greedy = { temperature: 0, max_tokens: 12, ignore_eos: true };
const chatOf = (text) => [{ role: 'user', content: text }];

async function post(path, body, headers = {}) {
  const res = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}`, ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, json: await res.json().catch(() => null) };
}

async function collect(stream) {
  let text = '';
  let usage = null;
  let finish = null;
  const chunks = [];
  for await (const chunk of stream) {
    chunks.push(chunk);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? c.text ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, usage, finish, chunks };
}

test('chat completion: the model template, usage always', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages: chatOf('In the beginning'), ...greedy });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 3);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
});

test('completion, streamed with usage, equals the same request unstreamed', async () => {
  const params = { model: 'any', prompt: 'And God said, Let there be', ...greedy };
  const whole = await client.completions.create(params);
  assert.equal(whole.object, 'text_completion');
  const streamed = await collect(await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } }));
  assert.equal(streamed.text, whole.choices[0].text);
  assert.deepEqual(streamed.usage, whole.usage);
  assert.equal(streamed.finish, 'length');
  assert.deepEqual(streamed.chunks.at(-1).choices, []);  // the usage chunk
});

test('stop strings end the text before them, streamed or not, and never leak', async () => {
  const base = { model: 'any', messages: chatOf('The LORD is my shepherd'), temperature: 0, max_tokens: 40, ignore_eos: true };
  const full = (await client.chat.completions.create(base)).choices[0].message.content;
  assert.ok(full.length > 12, full);
  const stop = full.slice(8, 11);
  const expected = full.slice(0, full.indexOf(stop));
  const whole = await client.chat.completions.create({ ...base, stop: [stop, 'zzzz'] });
  assert.equal(whole.choices[0].message.content, expected);
  assert.equal(whole.choices[0].finish_reason, 'stop');
  const streamed = await collect(await client.chat.completions.create({ ...base, stop, stream: true }));
  assert.equal(streamed.text, expected);
  assert.equal(streamed.finish, 'stop');
  for (const chunk of streamed.chunks)
    for (const c of chunk.choices) assert.ok(!(c.delta.content ?? '').includes(stop));
});

test('the same seed and parameters give the same text', async () => {
  const params = { model: 'any', messages: chatOf('Blessed are'), temperature: 1, top_p: 0.95, max_tokens: 16, ignore_eos: true };
  const a = await client.chat.completions.create({ ...params, seed: 42 });
  const b = await client.chat.completions.create({ ...params, seed: 42 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const others = await Promise.all([1, 2, 3].map((seed) => client.chat.completions.create({ ...params, seed })));
  assert.ok(others.some((o) => o.choices[0].message.content !== a.choices[0].message.content), 'seeds change the text');
});

test('n=2 returns two choices sharing the prompt', async () => {
  const r = await client.chat.completions.create({
    model: 'any', messages: chatOf('Honour thy father'), n: 2, temperature: 1, seed: 5, max_tokens: 8, ignore_eos: true,
  });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.equal(r.usage.completion_tokens, 16);
  const streamed = await client.chat.completions.create({
    model: 'any', messages: chatOf('Honour thy father'), n: 2, temperature: 1, seed: 5, max_tokens: 8, ignore_eos: true, stream: true,
  });
  const texts = ['', ''];
  for await (const chunk of streamed) for (const c of chunk.choices) texts[c.index] += c.delta.content ?? '';
  assert.deepEqual(texts, r.choices.map((c) => c.message.content));
});

test('logprobs and top_logprobs', async () => {
  const r = await client.chat.completions.create({
    model: 'any', messages: chatOf('Thou shalt'), ...greedy, logprobs: true, top_logprobs: 3,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 12);
  assert.equal(content.map((t) => t.token).join(''), r.choices[0].message.content);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    assert.equal(t.top_logprobs[0].token, t.token);  // greedy: the chosen token is the most likely
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
  }
  const legacy = await client.completions.create({ model: 'any', prompt: 'Thou shalt', ...greedy, logprobs: 2 });
  assert.equal(legacy.choices[0].logprobs.tokens.length, 12);
  assert.equal(Object.keys(legacy.choices[0].logprobs.top_logprobs[0]).length <= 2, true);
});

test('16 concurrent greedy streams produce the text each produces alone', async () => {
  const prompts = Array.from({ length: 16 }, (_, i) => `Verse ${i + 1}: and the ${['king', 'city', 'land', 'house'][i % 4]} of`);
  const solo = [];
  for (const p of prompts) solo.push((await client.completions.create({ model: 'any', prompt: p, ...greedy })).choices[0].text);
  const together = await Promise.all(
    prompts.map(async (p) => (await collect(await client.completions.create({ model: 'any', prompt: p, ...greedy, stream: true }))).text),
  );
  assert.deepEqual(together, solo);
});

test('bad requests get one clear 4xx in OpenAI\'s error shape', async () => {
  const shape = (r, status, param) => {
    assert.equal(r.status, status, JSON.stringify(r.json));
    assert.equal(typeof r.json.error.message, 'string');
    assert.equal(typeof r.json.error.type, 'string');
    assert.ok('param' in r.json.error && 'code' in r.json.error);
    if (param !== undefined) assert.equal(r.json.error.param, param);
  };
  const chat = '/v1/chat/completions';
  const msgs = chatOf('hi');
  shape(await post(chat, '{"messages": ['), 400);
  shape(await post(chat, '[1, 2]'), 400);
  shape(await post(chat, { messages: 'hi' }), 400, 'messages');
  shape(await post(chat, { messages: [{ role: 'wizard', content: 'hi' }] }), 400, 'messages[0].role');
  shape(await post(chat, { messages: msgs, temperature: 'hot' }), 400, 'temperature');
  shape(await post(chat, { messages: msgs, max_tokens: -1 }), 400, 'max_tokens');
  shape(await post(chat, { messages: msgs, max_tokens: 1e12 }), 400, 'max_tokens');
  shape(await post(chat, { messages: msgs, n: 0 }), 400, 'n');
  shape(await post(chat, { messages: msgs, top_p: 5 }), 400, 'top_p');
  shape(await post(chat, { messages: msgs, stop: [7] }), 400, 'stop[0]');
  shape(await post('/v1/completions', { prompt: [999999] }), 400, 'prompt');
  const long = await post('/v1/completions', { prompt: 'and the '.repeat(200), max_tokens: 10 });
  shape(long, 400, 'prompt');
  assert.match(long.json.error.message, /maximum context length is 256 tokens/);
  assert.match(long.json.error.message, /\d+ tokens/);
  const fits = await post('/v1/completions', { prompt: 'and the', max_tokens: 256 });
  shape(fits, 400, 'prompt');  // prompt + max_tokens beyond the context
  shape(await post(chat, JSON.stringify({ messages: msgs, pad: 'x'.repeat(5 << 20) })), 413);
  shape(await post('/v1/nothing', {}), 404);
  shape(await post('/detokenize', { tokens: [-1] }), 400, 'tokens');
  await assert.rejects(client.chat.completions.create({ model: 'any', messages: [] }), (e) => e.status === 400);
});

test('the API key guards /v1 routes; /health stays open', async () => {
  for (const headers of [{}, { Authorization: 'Bearer wrong' }]) {
    const r = await fetch(`${server.url}/v1/models`, { headers });
    assert.equal(r.status, 401);
    assert.equal((await r.json()).error.type, 'authentication_error');
    const c = await fetch(`${server.url}/v1/chat/completions`, { method: 'POST', headers, body: '{}' });
    assert.equal(c.status, 401);
  }
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
  const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'default.gguf');
});

test('tokenize, detokenize and metrics', async () => {
  const t = await post('/tokenize', { content: 'In the beginning' });
  assert.equal(t.status, 200);
  assert.ok(t.json.tokens.length >= 3);
  const d = await post('/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.content, 'In the beginning');
  const long = { model: 'any', prompt: 'and the word of the LORD came '.repeat(12), temperature: 0, max_tokens: 2 };
  const first = await client.completions.create(long);
  assert.ok(first.usage.prompt_tokens > 64, 'longer than one KV block');
  await client.completions.create(long);
  const m = await metrics(server.url);
  for (const name of ['minfer_requests_running', 'minfer_requests_waiting', 'minfer_kv_blocks_used', 'minfer_kv_blocks_cached',
    'minfer_kv_blocks_total', 'minfer_prompt_tokens_total', 'minfer_generated_tokens_total', 'minfer_prefix_cache_hit_tokens_total'])
    assert.ok(name in m, name);
  assert.ok(m.minfer_generated_tokens_total > 0);
  assert.ok(m.minfer_prefix_cache_hit_tokens_total > 0, 'repeated prompts hit the prefix cache');
  const text = await (await fetch(`${server.url}/metrics`)).text();
  assert.match(text, /minfer_time_to_first_token_seconds_bucket\{le="\+Inf"\} \d+/);
  assert.match(text, /minfer_time_per_output_token_seconds_count \d+/);
});

test('a stream aborted mid-way is cancelled and gives its blocks back', async () => {
  const stream = await client.chat.completions.create({
    model: 'any', messages: chatOf('Let us go'), temperature: 0, max_tokens: 200, ignore_eos: true, stream: true,
  });
  let chunks = 0;
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content && ++chunks === 3) break;  // leaving the loop aborts the request
  }
  const settled = await waitForMetrics(server.url, (m) => m.minfer_requests_running === 0 && m.minfer_kv_blocks_used === 0, 10_000);
  assert.equal(settled.minfer_requests_waiting, 0);
  assert.ok(settled.minfer_generated_tokens_total > 0);
});

test('the server is still healthy', async () => {
  assert.ok(server.alive());
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
  const r = await client.chat.completions.create({ model: 'any', messages: chatOf('Amen'), ...greedy });
  assert.equal(r.usage.completion_tokens, 12);
});
