/** `collimate processes …` against a real API server on the fake service. */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { run, type Io } from '../../../src/cli/commands.js';
import { fixture, type Fixture } from '../api/helpers.js';

let f: Fixture;
let url: string;
let key: string;

before(async () => {
  f = await fixture();
  key = f.key('cli-proc', 'pro');
  url = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
});
after(() => f.close());

async function cli(argv: string[], stdin?: AsyncIterable<Uint8Array>) {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const io: Io = {
    out: (s) => out.push(Buffer.from(s)),
    err: (s) => err.push(Buffer.from(s)),
    outBytes: (b) => out.push(b),
    errBytes: (b) => err.push(b),
    env: { COLLIMATE_BASE_URL: url, COLLIMATE_API_KEY: key },
    ...(stdin ? { stdin: () => stdin } : {}),
  };
  const code = await run(argv, io);
  return { code, out: Buffer.concat(out).toString(), err: Buffer.concat(err).toString() };
}

test('start prints the pid; send (from --data and from stdin, streamed), list, output to the exit, wait', async () => {
  const sb = JSON.parse((await cli(['sandboxes', 'create', '--template', 'base', '--json'])).out);
  const started = await cli(['processes', 'start', sb.id, '--stdin', '--tag', 'cli', '--', 'cat']);
  assert.equal(started.code, 0, started.err);
  const pid = started.out.trim();
  assert.match(pid, /^\d+$/);
  assert.equal((await cli(['processes', 'send', sb.id, pid, '--data', 'hello\n'])).out, 'wrote 6 bytes\n');
  async function* piped() {
    yield Buffer.from('from ');
    yield Buffer.from('stdin\n');
  }
  const sent = await cli(['processes', 'send', sb.id, pid, '--close'], piped());
  assert.equal(sent.code, 0, sent.err);
  assert.equal(sent.out, 'wrote 11 bytes, closed stdin\n');
  const listed = await cli(['processes', 'list', sb.id]);
  assert.match(listed.out, new RegExp(`${pid}\\s+exited\\s+0\\s+cli`));
  const output = await cli(['processes', 'output', sb.id, pid]);
  assert.equal(output.out, 'hello\nfrom stdin\n');
  assert.equal(output.code, 0);
  const waited = await cli(['processes', 'wait', sb.id, pid]);
  assert.equal(waited.out, `${pid} exited exit 0\n`);
});

test('kill with a signal; wait reports it; the exit status of output is the process\'s; errors carry codes', async () => {
  const sb = JSON.parse((await cli(['sandboxes', 'create', '--template', 'base', '--json'])).out);
  const pid = (await cli(['processes', 'start', sb.id, '--command', 'sleep 100'])).out.trim();
  const running = await cli(['processes', 'wait', sb.id, pid, '--timeout', '0.05']);
  assert.equal(running.code, 124);
  assert.equal((await cli(['processes', 'kill', sb.id, pid, '--signal', 'INT'])).code, 0);
  const waited = await cli(['processes', 'wait', sb.id, pid, '--json']);
  assert.equal(JSON.parse(waited.out).signal, 2);
  assert.equal(waited.code, 130);
  assert.equal((await cli(['processes', 'output', sb.id, pid])).code, 130);
  const missing = await cli(['processes', 'get', sb.id, '999999']);
  assert.equal(missing.code, 1);
  assert.match(missing.err, /process_not_found/);
  const tty = (await cli(['processes', 'start', sb.id, '--pty', '100x30', '--', 'sh'])).out.trim();
  assert.equal((await cli(['processes', 'resize', sb.id, tty, '120x40'])).code, 0);
  assert.equal((await cli(['processes', 'start', sb.id, '--pty', 'big', '--', 'sh'])).code, 2);
  assert.equal((await cli(['processes', 'start', sb.id])).code, 2);
});
