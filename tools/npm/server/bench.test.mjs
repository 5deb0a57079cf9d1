// minfer bench-serve against minfer serve: every request succeeds, the counts add up, and the
// latencies it reports are positive and ordered (p50 <= p99).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { startServer } from './harness.mjs';

let server;
before(async () => {
  server = await startServer(['--api-key', 'k', '--max-seqs', '8', '-c', '256']);
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

test('bench-serve reports every level with no failed request', async () => {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'minfer-bench-')), 'result.json');
  const { stdout } = await promisify(execFile)(process.env.MINFER_BINARY, [
    'bench-serve', '--url', `${server.url}/v1`, '--api-key', 'k', '--concurrency', '1,4', '--prompt-tokens', '20',
    '--max-tokens', '8', '--requests', '8', '--json', out,
  ], { timeout: 120_000 });
  assert.match(stdout, /Output token throughput \(tok\/s\):/);
  assert.match(stdout, /\| clients \| requests \| failed \| output tok\/s \|/);
  const levels = JSON.parse(fs.readFileSync(out, 'utf8'));
  assert.deepEqual(levels.map((l) => l.concurrency), [1, 4]);
  for (const l of levels) {
    assert.equal(l.failed, 0);
    assert.equal(l.requests, 8);
    assert.equal(l.output_tokens, 64);  // ignore_eos: exactly max_tokens each
    assert.ok(l.input_tokens >= 8 * 15 && l.input_tokens <= 8 * 25, `${l.input_tokens} prompt tokens`);
    assert.ok(l.output_throughput > 0);
    for (const k of ['ttft', 'tpot', 'itl', 'e2el']) assert.ok(l[k].mean_ms > 0 && l[k].median_ms <= l[k].p99_ms, k);
  }
});
