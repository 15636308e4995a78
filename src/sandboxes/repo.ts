import type { Db } from '../store/db.js';
import type { JailRecord } from '../vmm/jail.js';
import type { NetRecord } from '../net/netns.js';
import type { EgressPolicy } from '../net/policy.js';
import type { SandboxInfo, SandboxState, ListFilter, OnTimeout, OpenPort } from './types.js';

/**
 * The public states plus `deleting`, which a crash mid-delete can leave behind (reconcile finishes
 * the delete). In-flight suspends and forks are `pending_op` on a running row instead.
 */
export type RowState = SandboxState | 'deleting';

/** Where a sandbox's VMM is, so a restarted server can re-adopt it. */
export interface VmmRecord {
  pid: number;
  startTicks: string;
  dir: string;
  /** The sandbox's current top disk overlay (changes on live fork). */
  diskPath: string;
  memPath: string;
  memShared: boolean;
  /** The artifact the machine shape came from (kernel, initrd, layers, size). */
  artifactKey: string;
  /** The VMM's uid and cgroup when it runs confined (src/vmm/jail.ts). */
  jail?: JailRecord;
  /** The network namespace the VMM runs in, when networking is on (src/net/netns.ts). */
  net?: NetRecord;
}

export interface SnapshotRecord {
  /**
   * With `ramPath`: the device state (no RAM; a checkpoint's opening spliced before it, see
   * vmm/deviceState.ts). Without (snapshots made before RAM images): one migration stream, RAM
   * and devices.
   */
  statePath: string;
  /** The guest's RAM as a sparse image file (zero pages are holes). */
  ramPath?: string;
  /**
   * A suspend that kept only the files (`keep_memory: false`): no device state or RAM image
   * (`statePath` names where the former would be); the resume boots the guest from its disk.
   */
  diskOnly?: boolean;
  bytes: number;
  suspendedAt: number;
}

export interface PendingOp {
  /** `move`: a suspended sandbox being moved onto this host, not yet its owner (src/sandboxes/move.ts). */
  op: 'fork' | 'suspend' | 'move';
  forkPoint?: string;
  /** A suspend keeping only the files: it may have stopped the guest's processes (SIGSTOP) when it was cut off. */
  diskOnly?: boolean;
  startedAt: number;
}

export interface SandboxRow {
  id: string;
  tenant: string;
  template: string;
  state: RowState;
  labels: Record<string, string>;
  created_at: number;
  last_active: number;
  exec_count: number;
  parent: string | null;
  forked_at: number | null;
  /** The length each session starts with (create, fork, resume), in seconds. */
  timeout_secs: number;
  session_started_at: number;
  /**
   * When the current session ends (ms) and the reaper acts: session_started_at + timeout_secs at
   * each start, moved by a lease (session.ts).
   */
  session_ends_at: number;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  /** The effective egress policy (the environment's, or narrower if given at create); inherited by forks. */
  egress: EgressPolicy;
  vmm: VmmRecord | null;
  snapshot: SnapshotRecord | null;
  pending_op: PendingOp | null;
  /** Why it ended, when not by a delete (its VM died); null otherwise. */
  end_reason?: string | null;
  /** What the reaper does when the session ends; null only in rows from before (read as the server's COLLIMATE_REAP_ACTION). */
  on_timeout: OnTimeout | null;
  /** 1: a request that needs it running resumes it while suspended (E2B's autoResume). */
  auto_resume: number;
  /** 0: a suspend that does not say (the reaper's among them) keeps only its files; absent or 1: its memory too. Inherited by forks and snapshots. */
  keep_memory?: number;
  /** 1: its ports answer without a key or token (E2B's allowPublicTraffic); inherited by forks and snapshots. */
  public_ports: number;
  /** The Host header template its servers see through the ports proxy (portHost.ts); null: `localhost:<port>`. */
  port_host: string | null;
  /** The snapshot it was started from or last rolled back to (snapshots.ts); null otherwise. */
  from_snapshot?: string | null;
}

/** A kept moment of a sandbox (snapshots.ts): what a sandbox started from it or rolled back to it gets. */
export interface SnapshotRow {
  id: string;
  tenant: string;
  name: string | null;
  labels: Record<string, string>;
  /** The sandbox it was taken of (the only one that may roll back to it). */
  source: string;
  template: string;
  fork_point: string;
  artifact_key: string;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  egress: EgressPolicy;
  on_timeout: OnTimeout | null;
  auto_resume: number;
  /** The sandbox's keep_memory, for the sandboxes started from it (absent: 1). */
  keep_memory?: number;
  public_ports: number;
  port_host: string | null;
  timeout_secs: number;
  /** What its files occupy on disk: the RAM image, the device state and the frozen disk layer. */
  bytes: number;
  created_at: number;
  state: 'creating' | 'ready';
  /** The name it is promoted under (a template id its tenant creates from), or null. */
  environment: string | null;
  /** Null for a snapshot taken here; a copy pulled from another cluster host (snapshotCopies.ts): that host's id. */
  origin?: string | null;
}

function decodeSnapshot(r: any): SnapshotRow {
  return { ...r, labels: JSON.parse(r.labels), egress: JSON.parse(r.egress) };
}

function decode(r: any): SandboxRow {
  return {
    ...r,
    labels: JSON.parse(r.labels),
    egress: JSON.parse(r.egress),
    vmm: r.vmm ? JSON.parse(r.vmm) : null,
    snapshot: r.snapshot ? JSON.parse(r.snapshot) : null,
    pending_op: r.pending_op ? JSON.parse(r.pending_op) : null,
  };
}

/** Row-level persistence of sandboxes and fork points. Every method is one synchronous SQLite call. */
export class SandboxRepo {
  constructor(readonly db: Db) {}

  insert(row: SandboxRow): void {
    this.db.prepare(`INSERT INTO sandboxes (id, tenant, template, state, labels, created_at, last_active, exec_count, parent, forked_at,
        timeout_secs, session_started_at, session_ends_at, vcpus, memory_mib, disk_mib, egress, vmm, snapshot, pending_op, on_timeout, auto_resume, keep_memory, public_ports, port_host, from_snapshot)
      VALUES (@id, @tenant, @template, @state, @labels, @created_at, @last_active, @exec_count, @parent, @forked_at,
        @timeout_secs, @session_started_at, @session_ends_at, @vcpus, @memory_mib, @disk_mib, @egress, @vmm, @snapshot, @pending_op, @on_timeout, @auto_resume, @keep_memory, @public_ports, @port_host, @from_snapshot)`).run({
      ...row,
      keep_memory: row.keep_memory ?? 1,
      from_snapshot: row.from_snapshot ?? null,
      labels: JSON.stringify(row.labels),
      egress: JSON.stringify(row.egress),
      vmm: row.vmm ? JSON.stringify(row.vmm) : null,
      snapshot: row.snapshot ? JSON.stringify(row.snapshot) : null,
      pending_op: row.pending_op ? JSON.stringify(row.pending_op) : null,
    });
  }

  get(id: string): SandboxRow | undefined {
    const r = this.db.prepare('SELECT * FROM sandboxes WHERE id = ?').get(id);
    return r ? decode(r) : undefined;
  }

  update(id: string, fields: Partial<Omit<SandboxRow, 'id'>>): void {
    const cols: string[] = [];
    const vals: Record<string, unknown> = { id };
    for (const [k, v] of Object.entries(fields)) {
      cols.push(`${k} = @${k}`);
      vals[k] = k === 'labels' || k === 'egress' || k === 'vmm' || k === 'snapshot' || k === 'pending_op' ? (v == null ? null : JSON.stringify(v)) : v;
    }
    if (cols.length === 0) return;
    this.db.prepare(`UPDATE sandboxes SET ${cols.join(', ')} WHERE id = @id`).run(vals);
  }

  /** Every row not yet deleted, for reconciliation at start. */
  live(): SandboxRow[] {
    return this.db.prepare("SELECT * FROM sandboxes WHERE state != 'deleted'").all().map(decode);
  }

  /** The artifacts of the rows not yet deleted (running, suspended, being deleted). */
  artifactKeys(): string[] {
    return this.db.prepare("SELECT DISTINCT json_extract(vmm, '$.artifactKey') AS k FROM sandboxes WHERE state != 'deleted' AND vmm IS NOT NULL")
      .all().map((r: any) => r.k as string).filter((k) => typeof k === 'string');
  }

  list(filter: ListFilter, tenant?: string): SandboxRow[] {
    const where: string[] = ["state != 'deleted'"];
    const args: unknown[] = [];
    if (tenant !== undefined) { where.push('tenant = ?'); args.push(tenant); }
    if (filter.state) { where.push('state = ?'); args.push(filter.state); }
    for (const [k, v] of Object.entries(filter.labels ?? {})) {
      where.push('json_extract(labels, ?) = ?');
      // A JSON path's quoted key escapes with a backslash (doubling a quote matches nothing).
      args.push(`$."${k.replace(/[\\"]/g, '\\$&')}"`, v);
    }
    if (filter.after) { where.push('id > ?'); args.push(filter.after); }
    const limit = Math.min(Math.max(filter.limit ?? 100, 1), 1000);
    return this.db.prepare(`SELECT * FROM sandboxes WHERE ${where.join(' AND ')} ORDER BY id LIMIT ${limit + 1}`).all(...args).map(decode);
  }

  /**
   * Adds activity counted in memory (SandboxRegistry) to the rows, in one transaction: last_active
   * only moves forward, exec_count grows by the execs counted.
   */
  addActivity(entries: Iterable<[id: string, activity: { last: number; execs: number }]>): void {
    const stmt = this.db.prepare('UPDATE sandboxes SET last_active = MAX(last_active, ?), exec_count = exec_count + ? WHERE id = ?');
    this.tx(() => {
      for (const [id, a] of entries) stmt.run(a.last, a.execs, id);
    });
  }

  /**
   * Marks a row deleted, in one transaction: no VMM, snapshot or pending operation is left on it,
   * and it holds no fork point any more. `deletedAt` records when a client deleted it.
   */
  markDeleted(id: string, deletedAt?: number, reason?: string): void {
    this.tx(() => {
      this.update(id, { state: 'deleted', vmm: null, snapshot: null, pending_op: null });
      if (deletedAt !== undefined) this.db.prepare('UPDATE sandboxes SET deleted_at = ? WHERE id = ?').run(deletedAt, id);
      if (reason !== undefined) this.db.prepare('UPDATE sandboxes SET end_reason = ? WHERE id = ?').run(reason, id);
      this.dropRefs(id);
    });
  }

  /**
   * Removes the rows of sandboxes deleted before `before` (ms; when a client deleted them, or their
   * last activity for those that ended otherwise) that hold no fork point. Returns how many.
   */
  pruneDeleted(before: number): number {
    return this.db.prepare(`DELETE FROM sandboxes WHERE state = 'deleted' AND COALESCE(deleted_at, last_active) < ?
      AND id NOT IN (SELECT owner FROM fork_point_refs)`).run(before).changes;
  }

  /** Removes a row outright (a move onto this host that did not complete; a deleted row an incoming move replaces). */
  remove(id: string): void {
    this.tx(() => {
      this.db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id);
      this.dropRefs(id);
    });
  }

  children(id: string): string[] {
    return this.db.prepare("SELECT id FROM sandboxes WHERE parent = ? AND state != 'deleted' ORDER BY id").all(id).map((r: any) => r.id);
  }

  /** Running sandboxes whose session ended at or before `now` (ms), for the reaper; all of them, however many run. */
  sessionsEndedBy(now: number): SandboxRow[] {
    return this.db.prepare("SELECT * FROM sandboxes WHERE state = 'running' AND session_ends_at <= ? ORDER BY session_ends_at").all(now).map(decode);
  }

  /** Guest memory of every running sandbox, in MiB (host admission). */
  runningMemoryMib(): number {
    return (this.db.prepare("SELECT COALESCE(SUM(memory_mib), 0) AS n FROM sandboxes WHERE state = 'running'").get() as any).n;
  }

  countRunning(tenant: string): number {
    return (this.db.prepare("SELECT COUNT(*) AS n FROM sandboxes WHERE tenant = ? AND state = 'running'").get(tenant) as any).n;
  }

  addForkPoint(id: string, dir: string, memPath: string, diskPath: string): void {
    this.db.prepare('INSERT INTO fork_points (id, dir, mem_path, disk_path, created_at) VALUES (?, ?, ?, ?, ?)').run(id, dir, memPath, diskPath, Date.now());
  }

  markForkPointReady(id: string): void {
    this.db.prepare('UPDATE fork_points SET ready = 1 WHERE id = ?').run(id);
  }

  addRef(forkPoint: string, owner: string): void {
    this.db.prepare('INSERT OR IGNORE INTO fork_point_refs (fork_point, owner) VALUES (?, ?)').run(forkPoint, owner);
  }

  refsOf(owner: string): string[] {
    return this.db.prepare('SELECT fork_point FROM fork_point_refs WHERE owner = ?').all(owner).map((r: any) => r.fork_point);
  }

  dropRefs(owner: string): void {
    this.db.prepare('DELETE FROM fork_point_refs WHERE owner = ?').run(owner);
  }

  /** Fork points nothing refers to any more. */
  unreferencedForkPoints(): Array<{ id: string; dir: string; mem_path: string; disk_path: string }> {
    return this.db.prepare('SELECT id, dir, mem_path, disk_path FROM fork_points WHERE id NOT IN (SELECT fork_point FROM fork_point_refs)').all() as any;
  }

  forkPoint(id: string): { id: string; dir: string; mem_path: string; disk_path: string; ready: number } | undefined {
    return this.db.prepare('SELECT * FROM fork_points WHERE id = ?').get(id) as any;
  }

  allForkPoints(): Array<{ id: string; dir: string; mem_path: string; disk_path: string }> {
    return this.db.prepare('SELECT id, dir, mem_path, disk_path FROM fork_points').all() as any;
  }

  removeForkPoint(id: string): void {
    this.db.prepare('DELETE FROM fork_points WHERE id = ?').run(id);
    this.db.prepare('DELETE FROM fork_point_refs WHERE owner = ?').run(id);
  }

  insertSnapshot(s: SnapshotRow): void {
    this.db.prepare(`INSERT INTO snapshots (id, tenant, name, labels, source, template, fork_point, artifact_key, vcpus, memory_mib, disk_mib,
        egress, on_timeout, auto_resume, keep_memory, public_ports, port_host, timeout_secs, bytes, created_at, state, environment, origin)
      VALUES (@id, @tenant, @name, @labels, @source, @template, @fork_point, @artifact_key, @vcpus, @memory_mib, @disk_mib,
        @egress, @on_timeout, @auto_resume, @keep_memory, @public_ports, @port_host, @timeout_secs, @bytes, @created_at, @state, @environment, @origin)`).run({ ...s, keep_memory: s.keep_memory ?? 1, origin: s.origin ?? null, labels: JSON.stringify(s.labels), egress: JSON.stringify(s.egress) });
  }

  snapshot(id: string): SnapshotRow | undefined {
    const r = this.db.prepare('SELECT * FROM snapshots WHERE id = ?').get(id);
    return r ? decodeSnapshot(r) : undefined;
  }

  /** A tenant's ready snapshots by id, a page at a time (`after`: the last id seen); copies of other hosts' are not theirs to list. */
  snapshots(tenant: string | undefined, filter: { labels?: Record<string, string>; source?: string; environment?: string | true; after?: string; limit?: number }): SnapshotRow[] {
    const where: string[] = ["state = 'ready'", 'origin IS NULL'];
    const args: unknown[] = [];
    if (tenant !== undefined) { where.push('tenant = ?'); args.push(tenant); }
    if (filter.source) { where.push('source = ?'); args.push(filter.source); }
    if (filter.environment === true) where.push('environment IS NOT NULL');
    else if (filter.environment !== undefined) { where.push('environment = ?'); args.push(filter.environment); }
    for (const [k, v] of Object.entries(filter.labels ?? {})) {
      where.push('json_extract(labels, ?) = ?');
      args.push(`$."${k.replace(/[\\"]/g, '\\$&')}"`, v);
    }
    if (filter.after) { where.push('id > ?'); args.push(filter.after); }
    const limit = Math.min(Math.max(filter.limit ?? 100, 1), 1000);
    return this.db.prepare(`SELECT * FROM snapshots WHERE ${where.join(' AND ')} ORDER BY id LIMIT ${limit + 1}`).all(...args).map(decodeSnapshot);
  }

  /** Every ready snapshot here, copies of other hosts' included. */
  readySnapshots(): SnapshotRow[] {
    return this.db.prepare("SELECT * FROM snapshots WHERE state = 'ready' ORDER BY id").all().map(decodeSnapshot);
  }

  /** Copies of other hosts' snapshots held here (snapshotCopies.ts). */
  snapshotCopies(): SnapshotRow[] {
    return this.db.prepare("SELECT * FROM snapshots WHERE origin IS NOT NULL AND state = 'ready' ORDER BY id").all().map(decodeSnapshot);
  }

  /** Snapshots a crash caught before their files were whole (reconcile removes them). */
  unfinishedSnapshots(): SnapshotRow[] {
    return this.db.prepare("SELECT * FROM snapshots WHERE state = 'creating'").all().map(decodeSnapshot);
  }

  /** Promotes a snapshot under `name` (null: no longer); false if the tenant has another snapshot under that name. */
  setSnapshotEnvironment(id: string, name: string | null): boolean {
    try {
      this.db.prepare('UPDATE snapshots SET environment = ? WHERE id = ?').run(name, id);
      return true;
    } catch (err) {
      if ((err as { code?: string }).code === 'SQLITE_CONSTRAINT_UNIQUE') return false;
      throw err;
    }
  }

  markSnapshotReady(id: string, bytes: number): void {
    this.db.prepare("UPDATE snapshots SET state = 'ready', bytes = ? WHERE id = ?").run(bytes, id);
  }

  /** Removes a snapshot's row and its hold on its fork point (the caller collects the fork point). */
  removeSnapshot(id: string): void {
    this.tx(() => {
      this.db.prepare('DELETE FROM snapshots WHERE id = ?').run(id);
      this.db.prepare('DELETE FROM fork_point_refs WHERE owner = ?').run(id);
    });
  }

  /** The artifacts snapshots were taken on (sandboxes started from them run on those). */
  snapshotArtifactKeys(): Set<string> {
    return new Set(this.db.prepare('SELECT DISTINCT artifact_key FROM snapshots').all().map((r: any) => r.artifact_key as string));
  }

  /** Fork points a snapshot holds: their RAM images stay on disk though no VMM maps them. */
  snapshotForkPoints(): Set<string> {
    return new Set(this.db.prepare('SELECT fork_point FROM snapshots').all().map((r: any) => r.fork_point as string));
  }

  tx<T>(fn: () => T): T {
    return this.db.transaction(fn)();
  }
}

export function toInfo(row: SandboxRow, children: string[], now = Date.now(), ports: OpenPort[] = []): SandboxInfo {
  const publicState: SandboxState = row.state === 'suspended' ? 'suspended' : row.state === 'deleted' ? 'deleted' : 'running';
  return {
    id: row.id,
    template: row.template,
    state: publicState,
    tenant: row.tenant,
    labels: row.labels,
    created_at: new Date(row.created_at).toISOString(),
    age_secs: round1((now - row.created_at) / 1000),
    idle_secs: round1((now - row.last_active) / 1000),
    exec_count: row.exec_count,
    parent: row.parent,
    forked_at: row.forked_at === null ? null : new Date(row.forked_at).toISOString(),
    children,
    timeout_secs: row.timeout_secs,
    session_started_at: new Date(row.session_started_at).toISOString(),
    expires_at: new Date(row.session_ends_at).toISOString(),
    remaining_secs: publicState === 'running' ? round1((row.session_ends_at - now) / 1000) : null,
    vcpus: row.vcpus,
    memory_mib: row.memory_mib,
    disk_mib: row.disk_mib,
    egress: row.egress,
    ports,
    on_timeout: row.on_timeout ?? 'delete',
    keep_memory: row.keep_memory !== 0,
    memory_kept: publicState === 'suspended' && row.snapshot ? !row.snapshot.diskOnly : null,
    auto_resume: row.auto_resume === 1,
    public_ports: row.public_ports === 1,
    port_host: row.port_host ?? null,
    from_snapshot: row.from_snapshot ?? null,
  };
}

function round1(x: number): number {
  return Math.max(0, Math.round(x * 10) / 10);
}
