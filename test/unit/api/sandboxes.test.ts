import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

describe('sandbox endpoints', () => {
  let f: Fixture;
  let key: string;
  before(async () => {
    f = await fixture({ fake: { environments: { acme: [{ id: 'acme-env', kind: 'environment', description: 'own', interpreter: ['sh'], ready: true, vcpus: 2, memory_mib: 1024 }] } } });
    key = f.key('acme', 'pro');
  });
  after(() => f.close());

  const create = async (body: unknown = { template: 'python' }) => {
    const r = await f.req('createSandbox', { url: '/v1/sandboxes', key, body });
    assert.equal(r.statusCode, 201, r.body);
    return r.json();
  };

  test('create returns a running sandbox with the documented fields', async () => {
    const s = await create({ template: 'python', labels: { run: 'grpo-step-14' }, timeout_secs: 120 });
    assert.match(s.id, /^sbx_[0-9a-f]{12}$/);
    assert.equal(s.state, 'running');
    assert.equal(s.template, 'python');
    assert.deepEqual(s.labels, { run: 'grpo-step-14' });
    assert.equal(s.timeout_secs, 120);
    assert.equal(s.parent, null);
    assert.deepEqual(s.children, []);
    assert.equal('tenant' in s, false);
  });

  test('create defaults timeout_secs to the tier default', async () => {
    const s = await create({ template: 'base' });
    assert.equal(s.timeout_secs, 3600);
  });

  test('create: unknown template is 404 template_not_found; own environment works on pro', async () => {
    const r = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'nope' } });
    assertErrorBody(r, 'template_not_found');
    const s = await create({ template: 'acme-env' });
    assert.equal(s.template, 'acme-env');
  });

  test('create validation: strict body, types, missing template', async () => {
    for (const body of [{}, { template: 'python', extra: 1 }, { template: 5 }, { template: 'python', labels: { 'bad key!': 'x' } }, { template: 'python', timeout_secs: 0 }, { template: 'python', timeout_secs: 1.5 }, [], 'python', null]) {
      const r = await f.req('createSandbox', { url: '/v1/sandboxes', key, body });
      assertErrorBody(r, 'validation_error');
    }
    const r = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python', extra: 1 } });
    assert.match(r.json().error.message, /extra/);
    assert.ok(Array.isArray(r.json().error.issues));
  });

  test('malformed JSON is 400 invalid_json; wrong content type is 415; empty body is validation_error', async () => {
    let r = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody: '{"template": ', headers: { 'content-type': 'application/json' } });
    assertErrorBody(r, 'invalid_json');
    r = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody: 'template=python', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    assertErrorBody(r, 'unsupported_media_type');
    r = await f.req('createSandbox', { url: '/v1/sandboxes', key });
    assertErrorBody(r, 'validation_error');
    r = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody: '{"template":"python"}' }); // no content type: accepted as JSON
    assert.equal(r.statusCode, 201);
    r = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody: '{"template":"python","__proto__":{"x":1}}', headers: { 'content-type': 'application/json' } });
    assertErrorBody(r, 'validation_error');
  });

  test('JSON nested too deeply to parse is 400 invalid_json saying so, not the parser\'s stack overflow', async () => {
    const depth = 200_000;
    const rawBody = `{"template":"python","labels":${'['.repeat(depth)}${']'.repeat(depth)}}`;
    const r = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody, headers: { 'content-type': 'application/json' } });
    assertErrorBody(r, 'invalid_json');
    assert.match(r.json().error.message, /nests arrays or objects too deeply/);
    assert.doesNotMatch(r.json().error.message, /call stack/);
  });

  test('a JSON body that is not UTF-8 is 400 invalid_json, not run with replacement characters', async () => {
    for (const bad of [[0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x82]]) {
      const rawBody = Buffer.concat([Buffer.from('{"template":"py'), Buffer.from(bad), Buffer.from('"}')]);
      const r = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody, headers: { 'content-type': 'application/json' } });
      assertErrorBody(r, 'invalid_json');
      assert.match(r.json().error.message, /UTF-8/);
    }
    const s = await create();
    const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, rawBody: Buffer.from([...Buffer.from('{"command":"echo '), 0xff, ...Buffer.from('"}')]), headers: { 'content-type': 'application/json' } });
    assertErrorBody(r, 'invalid_json');
    // Valid UTF-8 beyond ASCII is still taken as it is.
    const ok = await f.req('createSandbox', { url: '/v1/sandboxes', key, rawBody: Buffer.from('{"template":"python","labels":{"k":"é😀"}}'), headers: { 'content-type': 'application/json' } });
    assert.equal(ok.statusCode, 201);
    assert.equal(ok.json().labels.k, 'é😀');
  });

  test('get, and bad ids are 404 sandbox_not_found', async () => {
    const s = await create();
    const r = await f.req('getSandbox', { url: `/v1/sandboxes/${s.id}`, key });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().id, s.id);
    for (const id of ['sbx_000000000000', 'nope', 'sbx_ABCDEF012345', 'sbx_0123', "sbx_0123456789ab'", 'x'.repeat(500), '%20']) {
      const r2 = await f.req('getSandbox', { url: `/v1/sandboxes/${id}`, key });
      assertErrorBody(r2, 'sandbox_not_found');
    }
  });

  test('list: own sandboxes, state and label filters, pagination', async () => {
    const g = await fixture();
    try {
      const k = g.key('lister', 'pro');
      const ids: string[] = [];
      for (let i = 0; i < 7; i++) {
        const r = await g.req('createSandbox', { url: '/v1/sandboxes', key: k, body: { template: 'base', labels: { n: String(i % 2), team: 'x' } } });
        ids.push(r.json().id);
      }
      await g.req('suspendSandbox', { url: `/v1/sandboxes/${ids[0]}/suspend`, key: k });
      let r = await g.req('listSandboxes', { url: '/v1/sandboxes', key: k });
      assert.equal(r.json().sandboxes.length, 7);
      assert.equal(r.json().next, null);
      r = await g.req('listSandboxes', { url: '/v1/sandboxes?state=suspended', key: k });
      assert.deepEqual(r.json().sandboxes.map((s: any) => s.id), [ids[0]]);
      r = await g.req('listSandboxes', { url: '/v1/sandboxes?label=n=1&label=team=x', key: k });
      assert.equal(r.json().sandboxes.length, 3);
      r = await g.req('listSandboxes', { url: '/v1/sandboxes?label=n=1&label=team=y', key: k });
      assert.equal(r.json().sandboxes.length, 0);
      const seen: string[] = [];
      let cursor: string | null = null;
      let pages = 0;
      do {
        const q: string = cursor ? `?limit=3&after=${cursor}` : '?limit=3';
        r = await g.req('listSandboxes', { url: `/v1/sandboxes${q}`, key: k });
        seen.push(...r.json().sandboxes.map((s: any) => s.id));
        cursor = r.json().next;
        pages++;
      } while (cursor);
      assert.equal(pages, 3);
      assert.deepEqual([...seen].sort(), [...ids].sort());
      for (const q of ['?state=deleted2', '?limit=0', '?limit=1001', '?limit=abc', '?label=novalue', '?label=%22x%22=1', '?bogus=1']) {
        r = await g.req('listSandboxes', { url: `/v1/sandboxes${q}`, key: k });
        assertErrorBody(r, 'validation_error');
      }
    } finally {
      await g.close();
    }
  });

  test('exec: the guest\'s limit flags (oom_killed, pids_limited) reach the REST result', async () => {
    const s = await create();
    const real = f.svc.exec.bind(f.svc);
    f.svc.exec = async (...a: Parameters<typeof real>) => ({ ...(await real(...a)), exit_code: 137, signal: 9, oom_killed: true, pids_limited: true, error: 'the exec hit its process limit' });
    try {
      const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'true' } });
      assert.equal(r.statusCode, 200);
      assert.equal(r.json().pids_limited, true);
      assert.equal(r.json().oom_killed, true);
      assert.match(r.json().error, /process limit/);
    } finally {
      f.svc.exec = real;
    }
  });

  test('exec: command, code, commands; exactly one is required', async () => {
    const s = await create();
    let r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'echo hello' } });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().stdout, 'hello\n');
    assert.equal(r.json().exit_code, 0);
    r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { code: 'print(1)' } });
    assert.equal(r.json().stdout, 'print(1)');
    r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { commands: [['echo', 'a'], ['exit', '3'], ['echo', 'b']] } });
    assert.equal(r.json().stdout, 'a\n');
    assert.equal(r.json().exit_code, 3);
    assert.equal(r.json().failed_index, 1);
    r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'cat', stdin: 'in', files: [{ path: '/x', content: 'eA==', encoding: 'base64', mode: 0o755 }], env: { A: '1' }, cwd: '/', timeout: 5 } });
    assert.equal(r.json().stdout, 'in');
    r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'printf-bytes ff00fe' } });
    assert.equal(r.json().stdout_encoding, 'base64');
    assert.equal(r.json().stdout, Buffer.from([0xff, 0, 0xfe]).toString('base64'));
    for (const body of [{}, { command: 'x', code: 'y' }, { commands: [] }, { commands: [[]] }, { command: 'x', timeout: 0 }, { command: 'x', timeout: 4000 }, { command: 'x', env: { 'A-B': '1' } }, { command: 'x', files: [{ path: '/a' }] }, { command: 'x', nope: true }]) {
      const r2 = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body });
      assertErrorBody(r2, 'validation_error');
    }
    const g = await f.req('getSandbox', { url: `/v1/sandboxes/${s.id}`, key });
    assert.equal(g.json().exec_count, 5);
  });

  test('exec seed: a decimal u64 string, echoed; drawn when absent; anything else is a 400 naming the format', async () => {
    const s = await create();
    for (const seed of ['0', '42', '18446744073709551615']) {
      const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'true', seed } });
      assert.equal(r.statusCode, 200);
      assert.equal(r.json().seed, seed);
    }
    const drawn = new Set<string>();
    for (let i = 0; i < 3; i++) {
      const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'true' } });
      assert.match(r.json().seed, /^(0|[1-9][0-9]{0,19})$/);
      assert.ok(BigInt(r.json().seed) < 1n << 64n);
      drawn.add(r.json().seed);
    }
    assert.equal(drawn.size, 3, 'a drawn seed is fresh for every exec');
    for (const seed of [42, '', '042', '-1', '+1', '1.0', '0x10', ' 1', '18446744073709551616', '99999999999999999999', '123456789012345678901', null]) {
      const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'true', seed } });
      assertErrorBody(r, 'validation_error');
      assert.match(JSON.stringify(r.json()), /seed must be an unsigned 64-bit integer written as a decimal string/, JSON.stringify(seed));
    }
  });

  test('exec streams SSE with Accept: text/event-stream', async () => {
    const s = await create();
    const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { commands: [['echo', 'out'], ['stderr', 'err'], ['printf-bytes', 'ff']] }, headers: { accept: 'text/event-stream' } });
    assert.equal(r.statusCode, 200);
    assert.match(String(r.headers['content-type']), /^text\/event-stream/);
    const events = parseSse(r.body);
    assert.deepEqual(events.map((e) => e.event), ['stdout', 'stderr', 'stdout', 'result']);
    assert.equal(Buffer.from(events[0].data.data, 'base64').toString(), 'out\n');
    assert.equal(Buffer.from(events[1].data.data, 'base64').toString(), 'err\n');
    assert.deepEqual([...Buffer.from(events[2].data.data, 'base64')], [0xff]);
    assert.equal(events[3].data.exit_code, 0);
    // Before the stream starts, mistakes keep their status codes.
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key });
    const r2 = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'echo' }, headers: { accept: 'text/event-stream' } });
    assertErrorBody(r2, 'invalid_state');
  });

  test('SSE: a failure after the stream started is an error event', async () => {
    const s = await create();
    const orig = f.svc.exec.bind(f.svc);
    f.svc.exec = async (id, req, scope, stream) => {
      stream?.onStdout?.(Buffer.from('partial'));
      throw new Error('agent socket closed: /secret/path');
    };
    try {
      const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'echo' }, headers: { accept: 'text/event-stream' } });
      const events = parseSse(r.body);
      assert.deepEqual(events.map((e) => e.event), ['stdout', 'error']);
      assert.equal(events[1].data.error.code, 'internal_error');
      assert.ok(!r.body.includes('/secret/path'), 'internal causes are not sent');
    } finally {
      f.svc.exec = orig;
    }
  });

  test('internal errors are 500 internal_error without the cause', async () => {
    const s = await create();
    const orig = f.svc.exec.bind(f.svc);
    f.svc.exec = async () => {
      throw new Error('ENOENT /var/lib/secret');
    };
    try {
      const r = await f.api.app.inject({ method: 'POST', url: `/v1/sandboxes/${s.id}/exec`, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, payload: '{"command":"x"}' });
      assert.equal(r.statusCode, 500);
      assert.equal(r.json().error.code, 'internal_error');
      assert.ok(!r.body.includes('secret'));
      assert.match(r.json().error.message, /\(request req-[0-9a-z]+\)/, 'a request id to find the logged cause');
    } finally {
      f.svc.exec = orig;
    }
  });

  test('fork, suspend, resume, delete follow the lifecycle', async () => {
    const p = await create({ template: 'node', labels: { role: 'parent' } });
    let r = await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { count: 3 } });
    assert.equal(r.statusCode, 201);
    const kids = r.json().sandboxes;
    assert.equal(kids.length, 3);
    for (const k of kids) {
      assert.equal(k.parent, p.id);
      assert.equal(k.state, 'running');
      assert.deepEqual(k.labels, { role: 'parent' });
    }
    r = await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key }); // no body: count 1
    assert.equal(r.json().sandboxes.length, 1);
    r = await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { labels: { role: 'child' } } });
    assert.deepEqual(r.json().sandboxes[0].labels, { role: 'child' });
    r = await f.req('getSandbox', { url: `/v1/sandboxes/${p.id}`, key });
    assert.equal(r.json().children.length, 5);
    for (const body of [{ count: 0 }, { count: 65 }, { count: 'two' }, { count: 1, x: 1 }]) {
      assertErrorBody(await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body }), 'validation_error');
    }

    r = await f.req('suspendSandbox', { url: `/v1/sandboxes/${p.id}/suspend`, key });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().state, 'suspended');
    // Fork of a suspended sandbox: the children run, the parent stays suspended.
    r = await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { count: 2 } });
    assert.equal(r.statusCode, 201);
    assert.deepEqual(r.json().sandboxes.map((c: any) => [c.state, c.parent]), [['running', p.id], ['running', p.id]]);
    r = await f.req('getSandbox', { url: `/v1/sandboxes/${p.id}`, key });
    assert.equal(r.json().state, 'suspended');
    assert.equal(r.json().children.length, 7);
    for (const [op, path, body] of [['execSandbox', 'exec', { command: 'echo' }], ['suspendSandbox', 'suspend', undefined]] as const) {
      const r2 = await f.req(op, { url: `/v1/sandboxes/${p.id}/${path}`, key, body });
      assertErrorBody(r2, 'invalid_state');
      assert.equal(r2.json().error.state, 'suspended');
      assert.match(r2.json().error.message, /resume/i);
    }
    r = await f.req('resumeSandbox', { url: `/v1/sandboxes/${p.id}/resume`, key });
    assert.equal(r.json().state, 'running');
    assertErrorBody(await f.req('resumeSandbox', { url: `/v1/sandboxes/${p.id}/resume`, key }), 'invalid_state');
    assertErrorBody(await f.req('suspendSandbox', { url: `/v1/sandboxes/${p.id}/suspend`, key, body: { force: true } }), 'validation_error');

    r = await f.req('deleteSandbox', { url: `/v1/sandboxes/${p.id}`, key });
    assert.equal(r.statusCode, 204);
    assert.equal(r.body, '');
    assertErrorBody(await f.req('getSandbox', { url: `/v1/sandboxes/${p.id}`, key }), 'sandbox_not_found');
    assertErrorBody(await f.req('deleteSandbox', { url: `/v1/sandboxes/${p.id}`, key }), 'sandbox_not_found');
  });

  test('files: PUT raw bytes of any content type, GET them back', async () => {
    const s = await create();
    const bytes = Buffer.from([0, 1, 2, 255, 254, 10]);
    let r = await f.req('writeFile', { url: `/v1/sandboxes/${s.id}/files?path=/tmp/a.bin&mode=755`, key, rawBody: bytes, headers: { 'content-type': 'application/json' } });
    assert.equal(r.statusCode, 200);
    assert.deepEqual(r.json(), { path: '/tmp/a.bin', size: 6 });
    r = await f.req('readFile', { url: `/v1/sandboxes/${s.id}/files?path=/tmp/a.bin`, key });
    assert.equal(r.statusCode, 200);
    assert.equal(r.headers['content-type'], 'application/octet-stream');
    assert.deepEqual(r.rawPayload, bytes);
    r = await f.req('writeFile', { url: `/v1/sandboxes/${s.id}/files?path=/empty`, key });
    assert.deepEqual(r.json(), { path: '/empty', size: 0 });
    assertErrorBody(await f.req('readFile', { url: `/v1/sandboxes/${s.id}/files?path=/missing`, key }), 'file_not_found');
    for (const q of ['', '?path=relative', '?path=/a&mode=999', '?path=/a&x=1']) {
      assertErrorBody(await f.req('readFile', { method: 'PUT', url: `/v1/sandboxes/${s.id}/files${q}`, key, rawBody: 'x' }), 'validation_error');
    }
    assertErrorBody(await f.req('readFile', { url: `/v1/sandboxes/${s.id}/files`, key }), 'validation_error');
  });

  test('on_timeout and auto_resume: shown on the sandbox, kept by forks; a suspended auto_resume sandbox is resumed by an exec, a file or a port request', async () => {
    const s = await create({ template: 'python', on_timeout: 'suspend', auto_resume: true });
    assert.deepEqual([s.on_timeout, s.auto_resume], ['suspend', true]);
    const plain = await create();
    assert.deepEqual([plain.on_timeout, plain.auto_resume], ['delete', false], 'the defaults');
    const [child] = (await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: { count: 1 } })).json().sandboxes;
    assert.deepEqual([child.on_timeout, child.auto_resume], ['suspend', true]);
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python', on_timeout: 'pause' } }), 'validation_error');

    const suspend = async (id: string) => assert.equal((await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key })).json().state, 'suspended');
    const state = async (id: string) => (await f.req('getSandbox', { url: `/v1/sandboxes/${id}`, key })).json().state;
    await suspend(s.id);
    const r = await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'echo back' } });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().stdout, 'back\n');
    assert.equal(await state(s.id), 'running');
    await suspend(s.id);
    assert.equal((await f.req('writeFile', { url: `/v1/sandboxes/${s.id}/files?path=/tmp/x`, method: 'PUT', key, rawBody: 'x', headers: { 'content-type': 'application/octet-stream' } })).statusCode, 200);
    assert.equal(await state(s.id), 'running');
    await suspend(plain.id);
    assertErrorBody(await f.req('execSandbox', { url: `/v1/sandboxes/${plain.id}/exec`, key, body: { command: 'true' } }), 'invalid_state');
    assert.equal(await state(plain.id), 'suspended');
  });

  test('files: bodies over the limit are 413 payload_too_large', async () => {
    const g = await fixture({ server: { maxFileBytes: 1024, maxJsonBodyBytes: 512 } });
    try {
      const k = g.key('t', 'pro');
      const s = (await g.req('createSandbox', { url: '/v1/sandboxes', key: k, body: { template: 'base' } })).json();
      assertErrorBody(await g.req('writeFile', { url: `/v1/sandboxes/${s.id}/files?path=/big`, key: k, rawBody: Buffer.alloc(2048) }), 'payload_too_large');
      assert.equal((await g.req('writeFile', { url: `/v1/sandboxes/${s.id}/files?path=/ok`, key: k, rawBody: Buffer.alloc(1000) })).statusCode, 200);
      assertErrorBody(await g.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key: k, body: { command: 'x'.repeat(600) } }), 'payload_too_large');
    } finally {
      await g.close();
    }
  });

  test('images, templates and template by id', async () => {
    let r = await f.req('listImages', { url: '/v1/images', key });
    assert.deepEqual(r.json().images.map((t: any) => t.id), ['base', 'python', 'node']);
    r = await f.req('listTemplates', { url: '/v1/templates', key });
    assert.deepEqual(r.json().templates.map((t: any) => t.id), ['base', 'python', 'node', 'acme-env']);
    r = await f.req('getTemplate', { url: '/v1/templates/python', key });
    assert.equal(r.json().kind, 'catalog');
    assertErrorBody(await f.req('getTemplate', { url: '/v1/templates/nope', key }), 'template_not_found');
    assertErrorBody(await f.req('getTemplate', { url: '/v1/templates/..%2F..', key }), 'template_not_found');
    // Another tenant does not see acme's environment.
    const other = f.key('other', 'pro');
    r = await f.req('listTemplates', { url: '/v1/templates', key: other });
    assert.deepEqual(r.json().templates.map((t: any) => t.id), ['base', 'python', 'node']);
    assertErrorBody(await f.req('getTemplate', { url: '/v1/templates/acme-env', key: other }), 'template_not_found');
  });

  test('unknown endpoints are 404 not_found; wrong methods 405 with Allow', async () => {
    let r = await f.req('getSandbox', { url: '/v1/nope', key });
    assertErrorBody(r, 'not_found');
    r = await f.req('getSandbox', { method: 'PATCH', url: '/v1/sandboxes', key });
    assertErrorBody(r, 'method_not_allowed');
    assert.equal(r.headers.allow, 'POST, GET');
  });
});

export function parseSse(text: string): Array<{ event: string; data: any }> {
  return text
    .split('\n\n')
    .filter((b) => b.trim() && !b.startsWith(':'))
    .map((b) => {
      const lines = b.split('\n');
      const event = lines.find((l) => l.startsWith('event:'))!.slice(6).trim();
      const data = JSON.parse(lines.filter((l) => l.startsWith('data:')).map((l) => l.slice(5)).join('\n'));
      return { event, data };
    });
}
