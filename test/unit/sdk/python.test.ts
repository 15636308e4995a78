import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';

test('Python SDK pieces without a server (unittest: error mapping, an answer before the body is sent, collimate_rl.map caps)', async () => {
  const script = fileURLToPath(new URL('./python/test_pure.py', import.meta.url));
  const r = await promisify(execFile)('/usr/bin/python3', [script], { timeout: 60_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stderr, /Ran 4 tests[\s\S]*\nOK\s*$/);
});
