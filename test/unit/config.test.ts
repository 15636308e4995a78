import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertSocketRoom, loadConfig, UNIX_SOCKET_PATH_MAX } from '../../src/config.ts';

test('a home or cache too deep for the VMM sockets under it is refused up front, naming the limit', () => {
  const ok = '/var/tmp/collimate-test-cache';
  assert.doesNotThrow(() => assertSocketRoom('/root/.collimate', ok));
  // The cache's deepest socket is 74 bytes below it; 33 is the most it may have.
  assert.doesNotThrow(() => assertSocketRoom('/root/.collimate', `/${'c'.repeat(32)}`));
  assert.throws(() => assertSocketRoom('/root/.collimate', `/${'c'.repeat(33)}`), /cache directory .* is too deep for the VMM sockets under it: they would be 108 bytes, past the 107 .*at most 33 bytes/);
  assert.throws(() => assertSocketRoom(`/${'h'.repeat(60)}`, ok), /home \(COLLIMATE_HOME or --home\) .* too deep/);
  // Every engine goes through it: a cold check once put its cache 42 bytes deep and its bake died of ENOENT.
  assert.throws(() => loadConfig({ home: '/tmp/h', cacheDir: '/tmp/collimate-cold-check/run-mdTE2I/cache' }, {}), /too deep/);
  assert.equal(UNIX_SOCKET_PATH_MAX, 107);
});

test('COLLIMATE_GUEST_ASLR: unseeded processes keep ASLR under KVM and lose it under TCG unless told', () => {
  const aslr = (env: NodeJS.ProcessEnv) => loadConfig({ home: '/tmp/h', cacheDir: '/tmp/c' }, env).unseededAslr;
  assert.equal(aslr({ COLLIMATE_ACCEL: 'kvm' }), true);
  assert.equal(aslr({ COLLIMATE_ACCEL: 'tcg' }), false);
  assert.equal(aslr({ COLLIMATE_ACCEL: 'tcg', COLLIMATE_GUEST_ASLR: 'auto' }), false);
  assert.equal(aslr({ COLLIMATE_ACCEL: 'tcg', COLLIMATE_GUEST_ASLR: 'on' }), true);
  assert.equal(aslr({ COLLIMATE_ACCEL: 'kvm', COLLIMATE_GUEST_ASLR: 'off' }), false);
  assert.throws(() => aslr({ COLLIMATE_ACCEL: 'tcg', COLLIMATE_GUEST_ASLR: 'yes' }), /COLLIMATE_GUEST_ASLR must be auto, on or off, not "yes"/);
});
