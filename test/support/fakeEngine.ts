/**
 * A stand-in for src/sandboxes/engine.ts with the same `Engine.open({home})` surface, backed by the
 * in-memory fake. `collimate serve` loads it when COLLIMATE_ENGINE_MODULE points here (CLI tests).
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import '../../src/service/migrations.js';
import { openDb, type Db } from '../../src/store/db.js';
import { FakeSandboxService } from './fakeSandboxService.js';

export class Engine extends FakeSandboxService {
  db!: Db;
  home!: string;

  static async open(opts: { home: string; progress?: (m: string) => void; catalogInBackground?: boolean }): Promise<Engine> {
    const e = new Engine({ events: true });
    e.home = opts.home;
    // As the engine's first start with an empty cache: a step line, and python left to the background.
    opts.progress?.('building initramfs');
    e.building = opts.catalogInBackground ? { python: { step: 'debootstrap --variant=minbase bookworm', secs: 3 } } : {};
    e.db = openDb(join(opts.home, 'collimate.db'));
    return e;
  }

  /** Readings like the engine's (GET /v1/stats): each running VMM 64 MiB resident, one CPU second more per reading. */
  vmmUsage(ids: readonly string[]): Map<string, { cpuSecs: number; rssBytes: number }> {
    this.readings++;
    return new Map(ids.map((id) => [id, { cpuSecs: this.readings, rssBytes: 64 * 1024 * 1024 }]));
  }

  private readings = 0;
  private building: Record<string, { step: string; secs: number }> = {};

  catalogStatus(): { building: Record<string, { step: string; secs: number }>; failed: Record<string, string> } {
    return { building: this.building, failed: {} };
  }

  override async close(): Promise<void> {
    await super.close();
    this.db.close();
    writeFileSync(join(this.home, 'engine-closed'), 'yes');
  }
}
