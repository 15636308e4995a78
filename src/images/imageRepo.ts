import { applyMigrations, registerMigrations, type Db, type Migration } from '../store/db.js';
import { parseEgress, type EgressPolicy } from '../net/policy.js';

/**
 * Tables of the image service (migration versions 20–29): a tenant's images (pulled manifests and
 * their layers; the layer files themselves live in the shared layer store) and environments (named
 * configurations baked into artifacts). Registered on import, and applied to an already-open
 * database by `applyImageMigrations`.
 */
export const IMAGE_MIGRATIONS: Migration[] = [
  {
    version: 20,
    name: 'images_environments',
    sql: `
      CREATE TABLE images (
        tenant            TEXT NOT NULL,
        id                TEXT NOT NULL,
        ref               TEXT NOT NULL,
        source_kind       TEXT NOT NULL,
        state             TEXT NOT NULL CHECK (state IN ('pulling','ready','failed')),
        error             TEXT,
        progress          TEXT,
        manifest          TEXT NOT NULL,
        config            TEXT NOT NULL,
        layers            TEXT NOT NULL,
        runtime           TEXT,
        transferred_bytes INTEGER NOT NULL DEFAULT 0,
        created_at        INTEGER NOT NULL,
        updated_at        INTEGER NOT NULL,
        PRIMARY KEY (tenant, id)
      );
      CREATE TABLE environments (
        tenant        TEXT NOT NULL,
        name          TEXT NOT NULL,
        image         TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('pending','baking','ready','failed')),
        error         TEXT,
        progress      TEXT,
        log           TEXT NOT NULL DEFAULT '',
        description   TEXT NOT NULL DEFAULT '',
        interpreter   TEXT NOT NULL,
        ready_command TEXT,
        ready_probe   TEXT,
        ready_timeout_secs INTEGER,
        vcpus         INTEGER NOT NULL,
        memory_mib    INTEGER NOT NULL,
        disk_mib      INTEGER NOT NULL,
        egress        TEXT NOT NULL DEFAULT 'allow',
        secrets       TEXT,
        secret_names  TEXT NOT NULL DEFAULT '[]',
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        PRIMARY KEY (tenant, name)
      );
    `,
  },
];

registerMigrations(IMAGE_MIGRATIONS);

export function applyImageMigrations(db: Db): void {
  applyMigrations(db, IMAGE_MIGRATIONS);
}

export type ImageState = 'pulling' | 'ready' | 'failed';
export type EnvironmentState = 'pending' | 'baking' | 'ready' | 'failed';

export interface ImageLayerRecord {
  digest: string;
  diffId: string;
  size: number;
  mediaType: string;
  /** Bytes of the stored erofs layer, once pulled. */
  storedBytes: number | null;
}

/** What every exec of an environment on this image starts from (secrets are added per environment). */
export interface ImageRuntime {
  env: Record<string, string>;
  cwd?: string;
  prefix?: string[];
  warnings: string[];
}

export interface ImageRow {
  tenant: string;
  id: string;
  ref: string;
  source_kind: string;
  state: ImageState;
  error: string | null;
  progress: string | null;
  manifest: string;
  config: import('./oci.js').ImageConfig;
  layers: ImageLayerRecord[];
  runtime: ImageRuntime | null;
  transferred_bytes: number;
  created_at: number;
  updated_at: number;
}

export interface EnvironmentRow {
  tenant: string;
  name: string;
  image: string;
  state: EnvironmentState;
  error: string | null;
  progress: string | null;
  log: string;
  description: string;
  interpreter: string[];
  ready_command: string | null;
  ready_probe: string | null;
  ready_timeout_secs: number | null;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  /** Stored as JSON; rows from before egress policies hold the bare word `allow`. */
  egress: EgressPolicy;
  /** Sealed (SecretBox) JSON object of the secret values; never leaves the service. */
  secrets: string | null;
  secret_names: string[];
  created_at: number;
  updated_at: number;
}

const IMAGE_JSON = ['config', 'layers', 'runtime'] as const;
const ENV_JSON = ['interpreter', 'secret_names'] as const;

function decode<T>(row: any, fields: readonly string[]): T {
  if (!row) return row;
  for (const f of fields) row[f] = row[f] === null ? null : JSON.parse(row[f]);
  return row as T;
}

/** The egress column: JSON, or the bare `allow`/`none` of rows written before policies were JSON. */
export function decodeEgress(text: string): EgressPolicy {
  return parseEgress(text === 'allow' || text === 'none' ? text : JSON.parse(text), 'environments.egress');
}

function decodeEnv(row: any): EnvironmentRow {
  const r = decode<any>(row, ENV_JSON);
  if (r) r.egress = decodeEgress(r.egress);
  return r;
}

/** Bake logs are kept to their last part: enough to see why a ready command failed. */
export const MAX_LOG_CHARS = 256 * 1024;

export class ImageRepo {
  /**
   * Told after every write to an environment's row (created, state or progress, log, deleted): a
   * cluster host mirrors its environments into the cluster database (src/cluster/environments.ts).
   */
  onEnvChange?: (tenant: string, name: string) => void;

  constructor(private readonly db: Db) {
    applyImageMigrations(db);
  }

  getImage(tenant: string, id: string): ImageRow | undefined {
    return decode(this.db.prepare('SELECT * FROM images WHERE tenant = ? AND id = ?').get(tenant, id), IMAGE_JSON);
  }

  imageByRef(tenant: string, ref: string): ImageRow | undefined {
    return decode(this.db.prepare('SELECT * FROM images WHERE tenant = ? AND ref = ? ORDER BY updated_at DESC LIMIT 1').get(tenant, ref), IMAGE_JSON);
  }

  listImages(tenant: string): ImageRow[] {
    return this.db.prepare('SELECT * FROM images WHERE tenant = ? ORDER BY created_at, id').all(tenant).map((r) => decode<ImageRow>(r, IMAGE_JSON));
  }

  allImages(): ImageRow[] {
    return this.db.prepare('SELECT * FROM images').all().map((r) => decode<ImageRow>(r, IMAGE_JSON));
  }

  putImage(r: ImageRow): void {
    this.db.prepare(`INSERT INTO images (tenant, id, ref, source_kind, state, error, progress, manifest, config, layers, runtime, transferred_bytes, created_at, updated_at)
      VALUES (@tenant, @id, @ref, @source_kind, @state, @error, @progress, @manifest, @config, @layers, @runtime, @transferred_bytes, @created_at, @updated_at)
      ON CONFLICT (tenant, id) DO UPDATE SET ref = excluded.ref, source_kind = excluded.source_kind, state = excluded.state, error = excluded.error,
        progress = excluded.progress, layers = excluded.layers, runtime = excluded.runtime, transferred_bytes = excluded.transferred_bytes, updated_at = excluded.updated_at`)
      .run({ ...r, config: JSON.stringify(r.config), layers: JSON.stringify(r.layers), runtime: r.runtime === null ? null : JSON.stringify(r.runtime) });
  }

  updateImage(tenant: string, id: string, patch: Partial<Pick<ImageRow, 'state' | 'error' | 'progress' | 'layers' | 'runtime' | 'transferred_bytes'>>): void {
    const sets: string[] = [];
    const vals: Record<string, unknown> = { tenant, id, updated_at: Date.now() };
    for (const [k, v] of Object.entries(patch)) {
      sets.push(`${k} = @${k}`);
      vals[k] = (IMAGE_JSON as readonly string[]).includes(k) && v !== null ? JSON.stringify(v) : v;
    }
    this.db.prepare(`UPDATE images SET ${sets.join(', ')}, updated_at = @updated_at WHERE tenant = @tenant AND id = @id`).run(vals);
  }

  deleteImage(tenant: string, id: string): void {
    this.db.prepare('DELETE FROM images WHERE tenant = ? AND id = ?').run(tenant, id);
  }

  getEnv(tenant: string, name: string): EnvironmentRow | undefined {
    return decodeEnv(this.db.prepare('SELECT * FROM environments WHERE tenant = ? AND name = ?').get(tenant, name));
  }

  listEnvs(tenant: string): EnvironmentRow[] {
    return this.db.prepare('SELECT * FROM environments WHERE tenant = ? ORDER BY created_at, name').all(tenant).map(decodeEnv);
  }

  allEnvs(): EnvironmentRow[] {
    return this.db.prepare('SELECT * FROM environments ORDER BY created_at').all().map(decodeEnv);
  }

  envsOfImage(tenant: string, image: string): EnvironmentRow[] {
    return this.db.prepare('SELECT * FROM environments WHERE tenant = ? AND image = ?').all(tenant, image).map(decodeEnv);
  }

  insertEnv(r: EnvironmentRow): void {
    this.db.prepare(`INSERT INTO environments (tenant, name, image, state, error, progress, log, description, interpreter, ready_command, ready_probe, ready_timeout_secs,
        vcpus, memory_mib, disk_mib, egress, secrets, secret_names, created_at, updated_at)
      VALUES (@tenant, @name, @image, @state, @error, @progress, @log, @description, @interpreter, @ready_command, @ready_probe, @ready_timeout_secs,
        @vcpus, @memory_mib, @disk_mib, @egress, @secrets, @secret_names, @created_at, @updated_at)`)
      .run({ ...r, interpreter: JSON.stringify(r.interpreter), secret_names: JSON.stringify(r.secret_names), egress: JSON.stringify(r.egress) });
    this.onEnvChange?.(r.tenant, r.name);
  }

  updateEnv(tenant: string, name: string, patch: Partial<Pick<EnvironmentRow, 'state' | 'error' | 'progress'>>): void {
    const sets = Object.keys(patch).map((k) => `${k} = @${k}`);
    this.db.prepare(`UPDATE environments SET ${sets.join(', ')}, updated_at = @updated_at WHERE tenant = @tenant AND name = @name`)
      .run({ ...patch, tenant, name, updated_at: Date.now() });
    this.onEnvChange?.(tenant, name);
  }

  appendLog(tenant: string, name: string, text: string): void {
    this.db.prepare(`UPDATE environments SET log = substr(log || @text, -${MAX_LOG_CHARS}) WHERE tenant = @tenant AND name = @name`).run({ tenant, name, text });
    this.onEnvChange?.(tenant, name);
  }

  deleteEnv(tenant: string, name: string): void {
    this.db.prepare('DELETE FROM environments WHERE tenant = ? AND name = ?').run(tenant, name);
    this.onEnvChange?.(tenant, name);
  }
}
