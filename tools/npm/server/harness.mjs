// Starts `minfer serve` (MINFER_BINARY) on a free loopback port with the CPU backend and the
// embedded default model, and stops it. Every wait is bounded.
import { spawn } from 'node:child_process';

export async function startServer(extraArgs = []) {
  const binary = process.env.MINFER_BINARY;
  if (!binary) throw new Error('MINFER_BINARY is not set (the CTest test sets it)');
  const args = ['serve', '--host', '127.0.0.1', '--port', '0', '--backend', 'cpu', ...extraArgs];
  const proc = spawn(binary, args, { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`minfer serve did not start in 60 s:\n${log}`)), 60_000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/[\d.]+:\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    proc.on('exit', (code) => reject(new Error(`minfer serve exited with ${code}:\n${log}`)));
  });
  proc.stderr.on('data', (d) => process.stderr.write(d));
  for (let i = 0; i < 600; i++) {
    const res = await fetch(`${url}/health`).catch(() => null);
    if (res && res.status === 200) break;
    if (i === 599) throw new Error('minfer serve did not become healthy in 60 s');
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    proc,
    alive: () => proc.exitCode === null && proc.signalCode === null,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      const exited = new Promise((r) => proc.on('exit', (code) => r(code)));
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
  };
}

// The /metrics samples as { name: value } (histogram lines left out).
export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^(minfer_[a-z_]+) ([-\d.e+]+)$/);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

// Polls /metrics until pred(metrics) holds; fails after `ms`.
export async function waitForMetrics(url, pred, ms = 20_000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    last = await metrics(url);
    if (pred(last)) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`metrics did not settle: ${JSON.stringify(last)}`);
}
