import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import { homePaths } from '../host/paths.js';
import { sha256Hex } from '../host/hash.js';
import { buildOnce } from '../host/buildOnce.js';
import { agentSourceFiles } from '../guest/agentBuild.js';

/** The guest agent binary, compiled once per source digest and cached under the data directory. */
export async function agentBinary(home: string, progress: (m: string) => void, build: (outDir: string) => Promise<string>): Promise<string> {
  const srcs = agentSourceFiles().sort();
  const digest = sha256Hex('agent-v1', ...srcs.map((f) => readFileSync(f)));
  const dir = join(homePaths(home).assets, `agent-${digest.slice(0, 16)}`);
  const bin = join(dir, 'collimate-agent');
  if (existsSync(bin)) return bin;
  mkdirSync(homePaths(home).tmp, { recursive: true });
  await buildOnce(dir, homePaths(home).tmp, async (tmp) => {
    progress('compiling the guest agent');
    const out = await build(tmp);
    if (out !== join(tmp, 'collimate-agent')) {
      const { renameSync } = await import('node:fs');
      renameSync(out, join(tmp, 'collimate-agent'));
    }
  });
  return bin;
}
