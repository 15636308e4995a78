/**
 * Compiles the guest agent (src/guest/agent/*.c) into a static binary.
 *
 * musl keeps the binary small and free of NSS/dlopen surprises, which matters for
 * something that runs as PID 1 out of an initramfs. Caching by content is the
 * caller's job: hash agentSourceFiles() together with the compiler identity.
 */
import { execFile } from 'node:child_process';
import { mkdir, rename, rm } from 'node:fs/promises';
import { readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const AGENT_BINARY_NAME = 'collimate-agent';
export const AGENT_SOURCE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), 'agent');

export const AGENT_CFLAGS: readonly string[] = ['-static', '-O2', '-Wall', '-Wextra', '-Werror', '-std=gnu11', '-s'];

export interface BuildAgentOptions {
  /** Compiler driver; defaults to $COLLIMATE_AGENT_CC or musl-gcc. */
  cc?: string;
}

/** Headers from outside agent/ that the agent includes (the seed environment). */
const AGENT_EXTRA_HEADERS = [resolve(AGENT_SOURCE_DIR, '..', 'seed', 'seed_env.h')];

/** Absolute paths of every source and header that goes into the binary, sorted. */
export function agentSourceFiles(): string[] {
  return readdirSync(AGENT_SOURCE_DIR)
    .filter((name) => name.endsWith('.c') || name.endsWith('.h'))
    .map((name) => join(AGENT_SOURCE_DIR, name))
    .concat(AGENT_EXTRA_HEADERS)
    .sort();
}

export async function buildAgent(outDir: string, options: BuildAgentOptions = {}): Promise<string> {
  const cc = options.cc ?? process.env.COLLIMATE_AGENT_CC ?? 'musl-gcc';
  const sources = agentSourceFiles().filter((path) => path.endsWith('.c'));
  await mkdir(outDir, { recursive: true });
  const output = join(outDir, AGENT_BINARY_NAME);
  // Compile beside the target and rename, so a concurrent reader never sees half a binary.
  const partial = `${output}.${process.pid}.${Date.now()}.partial`;
  try {
    await run(cc, [...AGENT_CFLAGS, '-o', partial, ...sources], { maxBuffer: 16 * 1024 * 1024 });
    await rename(partial, output);
  } catch (e) {
    await rm(partial, { force: true });
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === 'ENOENT') {
      throw new Error(`cannot build the guest agent: compiler ${cc} not found (install musl-tools)`);
    }
    throw new Error(`building the guest agent with ${cc} failed:\n${err.stderr ?? err.message}`);
  }
  return output;
}
