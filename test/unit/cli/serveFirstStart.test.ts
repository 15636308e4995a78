// What `collimate serve` says on a first start: each progress line with the time since `npm start`
// (COLLIMATE_STARTED_AT_MS, set by scripts/start.sh), the total on the serving line with what is
// still being built, and /healthz's `catalog`. The engine is the in-memory fake, which reports
// python as building in the background when serve asks for a background catalog.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { startServe } from '../../support/serveProcess.ts';

const FAKE_ENGINE = fileURLToPath(new URL('../../support/fakeEngine.ts', import.meta.url));

test('a first start says each step\'s time, the total since npm start, and what still builds; /healthz lists it', async () => {
  const home = mkdtempSync(join(tmpdir(), 'collimate-first-start-'));
  const serve = await startServe(['--port', '0', '--home', home, '--log-level', 'warn'], {
    ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE, COLLIMATE_ACCEL: 'tcg', COLLIMATE_STARTED_AT_MS: String(Date.now() - 42_000),
  });
  const stderr = serve.stderr();
  try {
    // At least the 42 s before serve was started; how much more is the machine's load, not the code's.
    assert.match(stderr, /^ {2}\[ {1,2}(?:4[2-9]|[5-9]\d|\d{3,})\.\d s\] building initramfs$/m);
    assert.match(stderr, /serving http:\S+ \(home .*\) after (?:4[2-9]|[5-9]\d|\d{3,})\.\d s in all \(set-up included\); still building python in the background \(GET \/healthz: catalog\.building\)$/m);
    const h = (await (await fetch(`${serve.url}/healthz`)).json()) as { catalog: { building: Record<string, { step: string }> } };
    assert.deepEqual(Object.keys(h.catalog.building), ['python']);
    assert.match(h.catalog.building.python.step, /debootstrap/);
  } finally {
    serve.child.kill('SIGKILL');
    rmSync(home, { recursive: true, force: true });
  }
});
