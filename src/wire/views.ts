/**
 * Views: the wire shapes every front door answers with (REST bodies, MCP structured results, the
 * in-process RL fleet's SandboxInfo). Explicit picks, so engine-internal fields (the tenant, VMM
 * records) never leak. No HTTP here: MCP and the RL fleet import this, not the server.
 */
import type { z } from 'zod';
import type { ExecResult, FileEntry, SandboxInfo, SnapshotInfo, TemplateInfo } from '../sandboxes/types.js';
import type { EnvironmentRow, ImageRow } from '../images/imageRepo.js';
import type * as S from './schemas.js';

/** Where the ports proxy serves a port of a sandbox, relative to the API base. */
export function portPath(id: string, port: number): string {
  return `/v1/sandboxes/${id}/ports/${port}/`;
}

export function sandboxView(i: SandboxInfo): z.infer<typeof S.Sandbox> {
  return {
    id: i.id,
    template: i.template,
    state: i.state,
    labels: i.labels,
    created_at: i.created_at,
    age_secs: i.age_secs,
    idle_secs: i.idle_secs,
    exec_count: i.exec_count,
    parent: i.parent,
    forked_at: i.forked_at,
    children: i.children,
    timeout_secs: i.timeout_secs,
    session_started_at: i.session_started_at,
    expires_at: i.expires_at,
    remaining_secs: i.remaining_secs,
    vcpus: i.vcpus,
    memory_mib: i.memory_mib,
    disk_mib: i.disk_mib,
    egress: i.egress,
    ports: (i.ports ?? []).map((p) => ({ port: p.port, protocol: p.protocol, url: portPath(i.id, p.port) })),
    on_timeout: i.on_timeout,
    keep_memory: i.keep_memory ?? true,
    memory_kept: i.memory_kept ?? null,
    auto_resume: i.auto_resume,
    public_ports: i.public_ports ?? false,
    port_host: i.port_host ?? null,
    from_snapshot: i.from_snapshot ?? null,
  };
}

export function snapshotView(s: SnapshotInfo): z.infer<typeof S.Snapshot> {
  return {
    id: s.id, name: s.name, labels: s.labels, sandbox_id: s.sandbox_id, template: s.template, created_at: s.created_at, size_bytes: s.size_bytes,
    vcpus: s.vcpus, memory_mib: s.memory_mib, disk_mib: s.disk_mib, egress: s.egress, environment: s.environment,
  };
}

export function templateView(t: TemplateInfo): z.infer<typeof S.Template> {
  return {
    id: t.id, kind: t.kind, ...(t.snapshot_id ? { snapshot_id: t.snapshot_id } : {}), description: t.description, interpreter: t.interpreter,
    runtimes: t.runtimes ?? {}, ready: t.ready, vcpus: t.vcpus, memory_mib: t.memory_mib,
  };
}

export function imageView(r: ImageRow): z.infer<typeof S.Image> {
  return {
    id: r.id,
    ref: r.ref,
    source: r.source_kind as 'oci-layout' | 'archive' | 'registry',
    state: r.state,
    error: r.error,
    progress: r.progress,
    layers: r.layers.map((l) => ({ digest: l.digest, diff_id: l.diffId, size: l.size, media_type: l.mediaType, stored_bytes: l.storedBytes })),
    config: {
      env: r.config.env,
      working_dir: r.config.workingDir ?? null,
      user: r.config.user ?? null,
      entrypoint: r.config.entrypoint ?? null,
      cmd: r.config.cmd ?? null,
    },
    warnings: r.runtime?.warnings ?? [],
    transferred_bytes: r.transferred_bytes,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

/** Secret values never appear here: only their names. */
export function environmentView(r: EnvironmentRow): z.infer<typeof S.Environment> {
  return {
    name: r.name,
    image: r.image,
    state: r.state,
    error: r.error,
    progress: r.progress,
    log_tail: r.log.trimEnd().split('\n').slice(-20).join('\n'),
    description: r.description,
    interpreter: r.interpreter,
    ready_command: r.ready_command,
    ready_probe: r.ready_probe,
    secret_names: r.secret_names,
    vcpus: r.vcpus,
    memory_mib: r.memory_mib,
    egress: r.egress,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

export function execResultView(r: ExecResult): z.infer<typeof S.ExecResult> {
  const v: z.infer<typeof S.ExecResult> = {
    stdout: r.stdout,
    stderr: r.stderr,
    stdout_encoding: r.stdout_encoding,
    stderr_encoding: r.stderr_encoding,
    exit_code: r.exit_code,
    timed_out: r.timed_out,
    stdout_truncated: r.stdout_truncated,
    stderr_truncated: r.stderr_truncated,
    seed: r.seed,
    timing: {
      queued_at: r.timing.queued_at,
      started_at: r.timing.started_at,
      finished_at: r.timing.finished_at,
      queued_ms: r.timing.queued_ms,
      run_ms: r.timing.run_ms,
    },
  };
  if (r.failed_index !== undefined) v.failed_index = r.failed_index;
  if (r.signal !== undefined) v.signal = r.signal;
  if (r.oom_killed) v.oom_killed = true;
  if (r.pids_limited) v.pids_limited = true;
  if (r.error !== undefined) v.error = r.error;
  return v;
}

/** ls-style permission string of mode bits (setuid/setgid/sticky shown as ls does). */
export function permissionString(mode: number): string {
  const rwx = (bits: number, special: boolean, ch: string) =>
    `${bits & 4 ? 'r' : '-'}${bits & 2 ? 'w' : '-'}${special ? (bits & 1 ? ch : ch.toUpperCase()) : bits & 1 ? 'x' : '-'}`;
  return rwx((mode >> 6) & 7, (mode & 0o4000) !== 0, 's') + rwx((mode >> 3) & 7, (mode & 0o2000) !== 0, 's') + rwx(mode & 7, (mode & 0o1000) !== 0, 't');
}

export function fileEntryView(e: FileEntry): z.infer<typeof S.FileEntry> {
  const view: z.infer<typeof S.FileEntry> = {
    name: e.name,
    path: e.path,
    type: e.type,
    size: e.size,
    mode: e.mode,
    permissions: permissionString(e.mode),
    uid: e.uid,
    gid: e.gid,
    owner: e.owner,
    group: e.group,
    modified_at: new Date(Number(e.mtimeNs / 1_000_000n)).toISOString(),
    mtime_ns: e.mtimeNs.toString(),
  };
  if (e.symlinkTarget !== undefined) view.symlink_target = e.symlinkTarget;
  if (e.xattrs !== undefined) view.xattrs = e.xattrs;
  return view;
}
