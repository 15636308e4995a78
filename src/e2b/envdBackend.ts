/**
 * envd's backend in production: the tenant service's native processes and files (the same calls
 * REST, MCP and the SDKs make), seen the way envd needs them.
 */
import type { TenantService } from '../service/tenantService.js';
import type { FileEntry, ProcessInfo } from '../sandboxes/types.js';
import type { EnvdBackend, FsEntry, ProcessExit } from './envd.js';

function fsEntry(e: FileEntry): FsEntry {
  return {
    name: e.name,
    path: e.path,
    type: e.type,
    size: e.size,
    mode: e.mode,
    owner: e.owner,
    group: e.group,
    mtimeMs: Number(e.mtimeNs / 1_000_000n),
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: e.symlinkTarget } : {}),
    ...metadataOf(e.xattrs),
  };
}

/** E2B's metadata is kept in `user.e2b.<key>` extended attributes, as E2B's envd keeps it. */
const METADATA_XATTR = 'e2b.';

function metadataOf(xattrs: Record<string, string> | undefined): { metadata?: Record<string, string> } {
  let metadata: Record<string, string> | undefined;
  for (const [name, value] of Object.entries(xattrs ?? {})) {
    if (name.startsWith(METADATA_XATTR) && name.length > METADATA_XATTR.length) (metadata ??= {})[name.slice(METADATA_XATTR.length)] = value;
  }
  return metadata ? { metadata } : {};
}

function exitOf(p: ProcessInfo): ProcessExit {
  if (p.status === 'lost') return { exitCode: -1, error: 'the process was lost: the guest no longer lists it' };
  return p.signal !== null ? { exitCode: p.exit_code ?? 128 + p.signal, signal: p.signal } : { exitCode: p.exit_code ?? 0 };
}

/** `maxUploadBytes`: the server's upload limit (COLLIMATE_MAX_UPLOAD_MIB), as for PUT /v1/sandboxes/{id}/files. */
export function tenantEnvdBackend(tenants: TenantService, limits: { maxUploadBytes: number }): EnvdBackend {
  return {
    async startProcess(scope, id, spec) {
      const p = await tenants.sandboxes.startProcess(scope, id, {
        argv: spec.argv,
        env: spec.env,
        ...(spec.cwd ? { cwd: spec.cwd } : {}),
        ...(spec.pty ? { pty: spec.pty } : {}),
        stdin: spec.stdin,
        ...(spec.tag ? { tag: spec.tag } : {}),
        ...(spec.user ? { user: spec.user } : {}),
      });
      return { pid: p.pid };
    },
    attachProcess(scope, id, pid, fromStart, watcher) {
      return tenants.sandboxes.watchProcessOutput(scope, id, pid, fromStart ? 'start' : 'now', (e) => {
        if (e.type === 'output') watcher.onOutput(e.stream, e.data);
        else if (e.type === 'exit') watcher.onExit(exitOf(e.process));
      });
    },
    async listProcesses(scope, id) {
      return (await tenants.sandboxes.listProcesses(scope, id))
        .filter((p) => p.status === 'running')
        .map((p) => ({ pid: p.pid, argv: p.argv, cwd: p.cwd, ...(p.tag !== null ? { tag: p.tag } : {}) }));
    },
    async sendInput(scope, id, pid, data) {
      await tenants.sandboxes.writeProcessStdin(scope, id, pid, data);
    },
    closeStdin: (scope, id, pid) => tenants.sandboxes.closeProcessStdin(scope, id, pid),
    signalProcess: (scope, id, pid, signal) => tenants.sandboxes.signalProcess(scope, id, pid, signal),
    resizeProcess: (scope, id, pid, cols, rows) => tenants.sandboxes.resizeProcess(scope, id, pid, cols, rows),
    stat: async (scope, id, path) => fsEntry(await tenants.sandboxes.fsStat(scope, id, path)),
    listDir: async (scope, id, path, depth) => (await tenants.sandboxes.fsList(scope, id, path, depth)).entries.map(fsEntry),
    async makeDir(scope, id, path, user) {
      const made = await tenants.sandboxes.fsMkdir(scope, id, path, user ? { user } : {});
      return { created: made.created, entry: fsEntry(made.entry) };
    },
    move: async (scope, id, from, to) => fsEntry(await tenants.sandboxes.fsRename(scope, id, from, to)),
    async remove(scope, id, path) {
      await tenants.sandboxes.fsRemove(scope, id, path);
    },
    async watchDir(scope, id, path, recursive, onEvent, onEnd) {
      const watch = await tenants.sandboxes.fsWatch(scope, id, path, recursive, {
        onChange: (c) => {
          if (c.op !== 'overflow') onEvent({ name: c.name, type: c.op });
        },
        onEnd: () => onEnd(),
      });
      return () => void watch.close();
    },
    readFile: (scope, id, path, sink) => tenants.sandboxes.downloadFile(scope, id, path, sink),
    writeFile: async (scope, id, path, data, opts = {}) => fsEntry(await tenants.sandboxes.uploadFile(scope, id, path, data, {
      maxBytes: limits.maxUploadBytes,
      ...(opts.user ? { user: opts.user } : {}),
      ...(opts.metadata ? { xattrs: Object.fromEntries(Object.entries(opts.metadata).map(([k, v]) => [METADATA_XATTR + k, v])) } : {}),
    })),
  };
}

