// The chat page in headless Chromium (Debian's chromium, driven by puppeteer-core): type a prompt,
// see streamed text appear, press stop; model text is rendered as text, never as HTML. Saves a
// screenshot (MINFER_E2E_OUT, default $TMPDIR/minfer-server-e2e).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { startServer, waitForMetrics } from './harness.mjs';

const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));
const OUT = process.env.MINFER_E2E_OUT || path.join(os.tmpdir(), 'minfer-server-e2e');
let server;
let browser;
let profile;

before(async () => {
  if (!CHROMIUM) return;
  server = await startServer(['-c', '2048', '--max-seqs', '4']);
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'minfer-chromium-'));
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    protocolTimeout: 60_000,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
});
after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
  if (profile) fs.rmSync(profile, { recursive: true, force: true });
});

test('the chat page streams a reply, stops it, and shows model text only as text', { skip: !CHROMIUM && 'chromium is not installed (scripts/deps installs it)' }, async () => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 700 });
  await page.goto(server.url, { waitUntil: 'load' });
  await page.waitForFunction(() => document.getElementById('model').textContent === 'default.gguf', { timeout: 10_000 });

  // A long reply, so that it is still streaming when stop is pressed.
  await page.$eval('#max_tokens', (el) => { el.value = '1500'; });
  await page.$eval('#temperature', (el) => { el.value = '0'; });
  await page.type('#prompt', 'In the beginning God created');
  await page.click('#send');
  await page.waitForFunction(() => {
    const m = document.querySelectorAll('.msg.assistant');
    return m.length === 1 && m[0].textContent.trim().length > 20;
  }, { timeout: 60_000 });
  assert.equal(await page.$eval('#stop', (b) => b.disabled), false, 'still streaming');
  await page.click('#stop');
  await page.waitForFunction(() => document.querySelector('.msg.assistant .meta')?.textContent === 'stopped', { timeout: 10_000 });
  assert.equal(await page.$eval('#send', (b) => b.disabled), false);
  const shown = await page.$eval('.msg.assistant', (m) => m.textContent);
  assert.ok(shown.length > 20);
  await waitForMetrics(server.url, (m) => m.minfer_requests_running === 0 && m.minfer_kv_blocks_used === 0, 10_000);

  // Whatever the model writes is put in as text: markup in it is shown, never run.
  const rendered = await page.evaluate(() => {
    const div = document.createElement('div');
    renderMarkdown(div, 'a <img src=x onerror="window.injected=1"> **bold** `code` <script>window.injected=2</script>\n```js\n<b>x</b>\n```');
    document.getElementById('log').appendChild(div);
    return { img: div.querySelectorAll('img, script, b').length, strong: div.querySelectorAll('strong').length,
      pre: div.querySelectorAll('pre').length, text: div.textContent, injected: window.injected };
  });
  assert.equal(rendered.img, 0);
  assert.equal(rendered.strong, 1);
  assert.equal(rendered.pre, 1);
  assert.equal(rendered.injected, undefined);
  assert.match(rendered.text, /<img src=x/);

  fs.mkdirSync(OUT, { recursive: true });
  const shot = path.join(OUT, 'chat-page.png');
  await page.screenshot({ path: shot });
  assert.ok(fs.statSync(shot).size > 1000);
  console.log(`screenshot: ${shot}`);
});
