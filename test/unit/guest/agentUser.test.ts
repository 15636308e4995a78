/**
 * USER (src/guest/agent/user.c): execs, processes and file requests run as an account of the image,
 * against the real agent in test mode on this host, whose /etc/passwd has `nobody` (65534, home
 * /nonexistent). The tests run as root, as the agent does in a guest.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentClient, AgentError } from '../../../src/guest/agentClient.js';
import { MessageType, decodeProcExit, decodeProcOutput, type Frame, type ProcExit, type ProcOutput } from '../../../src/guest/protocol.js';
import { connectSocket, startTestAgent } from '../../support/agentSocket.js';

const NOBODY = (() => {
  const line = readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith('nobody:'));
  const [, , uid, gid, , home] = line!.split(':');
  return { uid: Number(uid), gid: Number(gid), home };
})();

let workDir: string;
/** Writable by everyone (sticky, like /tmp); `closed` inside it is root's alone. */
let shared: string;
let closed: string;
let socketPath: string;
let agent: ChildProcess;

before(async () => {
  workDir = await mkdtemp(join(tmpdir(), 'collimate-agent-user-'));
  chmodSync(workDir, 0o755);
  shared = join(workDir, 'shared');
  mkdirSync(shared, { mode: 0o1777 });
  chmodSync(shared, 0o1777);
  closed = join(workDir, 'closed');
  mkdirSync(closed, { mode: 0o700 });
  ({ agent, socketPath } = await startTestAgent(workDir));
});

after(async () => {
  agent?.kill('SIGKILL');
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

async function withClient<T>(use: (client: AgentClient, events: { outputs: ProcOutput[]; exits: ProcExit[] }) => Promise<T>): Promise<T> {
  const client = new AgentClient(await connectSocket(socketPath));
  const events = { outputs: [] as ProcOutput[], exits: [] as ProcExit[] };
  client.on('event', (frame: Frame) => {
    if (frame.type === MessageType.ProcOutput) events.outputs.push(decodeProcOutput(frame.payload));
    if (frame.type === MessageType.ProcExit) events.exits.push(decodeProcExit(frame.payload));
  });
  try {
    return await use(client, events);
  } finally {
    client.close();
    await sleep(30);
  }
}

const rejectsWith = (code: string) => (e: unknown) => e instanceof AgentError && e.code === code;

const WHO = 'echo "$(id -u) $(id -g) $(id -G)|$HOME|$USER|$LOGNAME|$(pwd)"';

describe('running as a user', () => {
  it('an exec runs with the account\'s ids, HOME, USER and LOGNAME; its home (or /) is the default cwd; the request\'s ENV and CWD still win', async () => {
    await withClient(async (client) => {
      const as = await client.exec({ commands: [['sh', '-c', WHO]], user: 'nobody' });
      assert.equal(as.result.exitCode, 0, as.stderr.toString());
      // /nonexistent does not exist: the command starts in /.
      assert.equal(as.stdout.toString().trim(), `${NOBODY.uid} ${NOBODY.gid} ${NOBODY.gid}|${NOBODY.home}|nobody|nobody|/`);
      const root = await client.exec({ commands: [['sh', '-c', 'id -u']] });
      assert.equal(root.stdout.toString().trim(), '0', 'without USER, root as before');
      const explicit = await client.exec({ commands: [['sh', '-c', 'echo "$HOME|$(pwd)"']], user: 'nobody', env: { HOME: '/elsewhere' }, cwd: shared });
      assert.equal(explicit.stdout.toString().trim(), `/elsewhere|${shared}`);
      const asRoot = await client.exec({ commands: [['sh', '-c', 'echo "$(id -u)|$HOME|$USER"']], user: 'root' });
      assert.equal(asRoot.stdout.toString().trim(), '0|/root|root');
    });
  });

  it("the kernel checks an exec's own writes against the account's permissions; the request's files are written by the agent and owned by the account", async () => {
    await withClient(async (client) => {
      const denied = await client.exec({ commands: [['sh', '-c', `touch ${closed}/x`]], user: 'nobody' });
      assert.notEqual(denied.result.exitCode, 0, 'a root-only directory is closed to the account');
      const made = await client.exec({ commands: [['sh', '-c', `touch ${shared}/by-exec`]], user: 'nobody', files: [{ path: join(closed, 'sub', 'given.txt'), data: Buffer.from('hi') }] });
      assert.equal(made.result.exitCode, 0, made.stderr.toString());
      for (const p of [join(shared, 'by-exec'), join(closed, 'sub'), join(closed, 'sub', 'given.txt')]) assert.equal(statSync(p).uid, NOBODY.uid, p);
    });
  });

  it('a process runs as the account, on pipes and on a terminal', async () => {
    await withClient(async (client, events) => {
      const { pid } = await client.startProcess({ argv: ['sh', '-c', WHO], user: 'nobody' });
      const pty = await client.startProcess({ argv: ['sh', '-c', 'id -u'], user: 'nobody', pty: { cols: 80, rows: 24 } });
      for (let i = 0; i < 200 && events.exits.filter((e) => e.pid === pid || e.pid === pty.pid).length < 2; i++) await sleep(25);
      const text = (p: number) => Buffer.concat(events.outputs.filter((o) => o.pid === p).map((o) => o.data)).toString().trim();
      assert.equal(text(pid), `${NOBODY.uid} ${NOBODY.gid} ${NOBODY.gid}|${NOBODY.home}|nobody|nobody|/`);
      assert.equal(text(pty.pid), String(NOBODY.uid));
    });
  });

  it("file requests with USER are done as E2B's envd does them: what they create is the account's, wherever it is; relative paths are under its home; the agent stays root", async () => {
    await withClient(async (client) => {
      const dir = join(closed, 'made', 'deep');
      const made = await client.mkdir(dir, undefined, 'nobody');
      assert.equal(made.entry.uid, NOBODY.uid);
      assert.equal(statSync(join(closed, 'made')).uid, NOBODY.uid, 'the parents made are the account\'s too');
      assert.equal(statSync(closed).uid, 0, 'what existed stays whose it was');

      const target = join(dir, 'up.txt');
      const up = await client.uploadFile(target, Readable.from([Buffer.from('uploaded')]), { tempPath: join(dir, '.up.tmp'), user: 'nobody' });
      assert.equal(up.uid, NOBODY.uid);
      assert.equal(readFileSync(target, 'utf8'), 'uploaded');
      const fresh = await client.uploadFile(join(closed, 'new-dir', 'f.txt'), Readable.from([Buffer.from('x')]), { tempPath: join(closed, 'new-dir', '.f.tmp'), user: 'nobody' });
      assert.equal(fresh.uid, NOBODY.uid);
      assert.equal(statSync(join(closed, 'new-dir')).uid, NOBODY.uid);

      // Without USER: root's.
      const root = await client.mkdir(join(closed, 'by-root'));
      assert.equal(root.entry.uid, 0);
    });
  });

  it('an account the image does not have, or a malformed name, is refused before anything runs', async () => {
    await withClient(async (client) => {
      await assert.rejects(client.exec({ commands: [['touch', join(shared, 'never')]], user: 'no-such-account' }), rejectsWith('user_not_found'));
      await assert.rejects(client.startProcess({ argv: ['true'], user: 'no-such-account' }), rejectsWith('user_not_found'));
      await assert.rejects(client.mkdir(join(shared, 'never-dir'), undefined, 'no-such-account'), rejectsWith('user_not_found'));
      assert.throws(() => statSync(join(shared, 'never')));
      assert.throws(() => statSync(join(shared, 'never-dir')));
      await assert.rejects(client.exec({ commands: [['true']], user: 'a:b' }), (e: unknown) => e instanceof AgentError);
    });
  });
});
