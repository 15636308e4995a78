// TypeScript SDK quickstart, in a project with `npm install @collimate/sdk` (sdk/typescript). Run it
// against a server (`npm start`) with a key (`collimate keys create`):
//   COLLIMATE_API_KEY=clm_… node --import tsx quickstart.ts
// In this repository, docs/examples/tsconfig.json resolves @collimate/sdk to the package's sources:
//   COLLIMATE_API_KEY=clm_… TSX_TSCONFIG_PATH=docs/examples/tsconfig.json node --import tsx docs/examples/quickstart.ts
import { Collimate, InvalidStateError } from '@collimate/sdk';

const client = new Collimate(); // COLLIMATE_API_KEY, COLLIMATE_BASE_URL (default http://127.0.0.1:7070)
console.log('images:', (await client.images()).map((i) => i.id).join(', '));

// `await using` deletes the sandbox when the block ends, also on error.
await using sb = await client.sandboxes.create({ template: 'base', labels: { example: 'quickstart' } });

const r = await sb.exec({ command: 'echo "hello from $(uname -s)"' });
console.log(r.stdout.trim(), `(exit ${r.exit_code})`);

// Stream output as it is produced.
await sb.exec({ command: 'for i in 1 2 3; do echo tick $i; sleep 0.2; done' }, { onStdout: (chunk) => process.stdout.write(chunk) });

// Files persist between execs; a live fork copies them (and every running process).
await sb.files.write('/root/notes.txt', 'remember me');
const [child] = await sb.fork(1);
console.log('child reads:', (await child.files.read('/root/notes.txt')).toString());
await child.delete();

// Suspend frees a concurrency slot; exec needs the sandbox running again.
await sb.suspend();
try {
  await sb.exec({ command: 'true' });
} catch (e) {
  if (e instanceof InvalidStateError) console.log('while suspended:', e.code);
  else throw e;
}
await sb.resume();
console.log('after resume:', (await sb.exec({ command: 'cat /root/notes.txt' })).stdout);
