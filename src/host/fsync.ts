import { open } from 'node:fs/promises';

/** Flushes a file's data to the disk (a suspend's or a snapshot's files are whole once this returns). */
export async function fsyncFile(path: string): Promise<void> {
  const h = await open(path, 'r');
  try {
    await h.sync();
  } finally {
    await h.close();
  }
}
