/**
 * One sandbox: its details, the fork lineage of the whole tree it belongs to (and the snapshot it was
 * started from), its snapshots (take one; start sandboxes from one, roll back to one — confirmed —,
 * delete one), actions (exec, fork N, suspend, resume, extend, delete — delete confirmed), its CPU and
 * memory over its life (charts, pages/metrics.ts), a code cell in its stateful kernel (pages/code.ts),
 * a web terminal, a file browser, its ports with signed URLs, and the execs run from this page. Kept
 * live from /v1/events.
 */
import { allSandboxes, allSnapshots, api, apiBlob, apiBytes, takeSnapshot, type Sandbox, type Snapshot } from '../api.js';
import { duration, errorBox, fill, h } from '../dom.js';
import type { Page } from '../app.js';
import { codeSection } from './code.js';
import { followSandboxes } from './live.js';
import { metricsSection } from './metrics.js';
import { snapshotTable } from './snapshots.js';
import { openTerminal, type WebTerminal } from './terminal.js';

interface ExecEntry { command: string; exit_code: number; timed_out: boolean; duration_ms: number; started_at: string }

export const sandboxPage: Page = (main, id) => {
  const sandboxId = id!;
  const err = errorBox();
  const details = h('dl', { class: 'details', id: 'details' });
  const tree = h('div', { class: 'tree', id: 'lineage', 'aria-label': 'Fork lineage' });
  const actions = h('div', { class: 'actions', id: 'actions' });
  const provenance = h('p', { id: 'provenance', hidden: true });
  const snapshots = h('div', { id: 'snapshots' });
  const execOut = h('pre', { class: 'output', id: 'exec-output', 'aria-live': 'polite' });
  const execList = h('tbody', { id: 'execs' });
  const terminalBox = h('div', { class: 'terminal', id: 'terminal' });
  const files = h('div', { id: 'files' });
  const ports = h('div', { id: 'ports' });
  const metrics = metricsSection(sandboxId);
  const code = codeSection(sandboxId);
  let current: Sandbox | null = null;
  let terminal: WebTerminal | null = null;
  let gone = false;

  const title = h('h1', {}, sandboxId);
  fill(
    main,
    h('p', {}, h('a', { href: '#/sandboxes' }, '← All sandboxes')),
    title,
    err.el,
    h('div', { class: 'columns' },
      h('section', { 'aria-labelledby': 'h-details' }, h('h2', { id: 'h-details' }, 'Details'), details, actions),
      h('section', { 'aria-labelledby': 'h-lineage' },
        h('h2', { id: 'h-lineage' }, 'Fork lineage'), provenance, tree,
        h('h2', { id: 'h-snapshots' }, 'Snapshots'), snapshotForm(), snapshots),
    ),
    h('section', { 'aria-labelledby': 'h-metrics' }, h('h2', { id: 'h-metrics' }, 'Metrics'), metrics.el),
    h('section', { 'aria-labelledby': 'h-code' }, h('h2', { id: 'h-code' }, 'Code'), code.el),
    h('section', { 'aria-labelledby': 'h-exec' },
      h('h2', { id: 'h-exec' }, 'Exec'),
      execForm(),
      execOut,
      h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, ...['Command', 'Exit', 'Duration', 'When'].map((c) => h('th', { scope: 'col' }, c)))),
        execList),
    ),
    h('section', { 'aria-labelledby': 'h-term' },
      h('h2', { id: 'h-term' }, 'Terminal'),
      h('button', { type: 'button', id: 'open-terminal', onclick: () => void toggleTerminal() }, 'Open terminal'),
      terminalBox,
    ),
    h('section', { 'aria-labelledby': 'h-files' }, h('h2', { id: 'h-files' }, 'Files'), files),
    h('section', { 'aria-labelledby': 'h-ports' }, h('h2', { id: 'h-ports' }, 'Ports'), ports),
  );

  // ---- details and actions ---------------------------------------------------------------------

  const load = async () => {
    try {
      const s = await api<Sandbox>('GET', `/v1/sandboxes/${sandboxId}`);
      current = s;
      err.clear();
      renderDetails(s);
      renderActions(s);
      renderPorts(s);
      metrics.show(s);
      code.show(s);
      void loadExecs();
    } catch (e) {
      if ((e as { code?: string }).code === 'sandbox_not_found') {
        gone = true;
        fill(details, h('p', { class: 'notice', role: 'status' }, 'This sandbox no longer exists.'));
        fill(actions);
        metrics.show(null);
        code.show(null);
      } else err.show(e);
    }
    await Promise.all([loadTree(), loadSnapshots()]);
  };

  function renderDetails(s: Sandbox): void {
    const rows: Array<[string, string | Node]> = [
      ['State', h('span', { class: `state ${s.state}`, id: 'state' }, s.state === 'suspended' && s.memory_kept === false ? 'suspended (files only: a resume boots it afresh)' : s.state)],
      ['Template', s.template],
      ['Created', `${new Date(s.created_at).toLocaleString()} (${duration(s.age_secs)} ago)`],
      ['Idle', duration(s.idle_secs)],
      ['Execs', String(s.exec_count)],
      ['Size', `${s.vcpus} vCPU · ${s.memory_mib} MiB RAM · ${s.disk_mib} MiB disk`],
      ['Expires', s.remaining_secs === null ? new Date(s.expires_at).toLocaleString() : `in ${duration(s.remaining_secs)}`],
      ['Labels', Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(', ') || '—'],
    ];
    fill(details, ...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
  }

  function renderActions(s: Sandbox): void {
    const busy = (label: string, run: () => Promise<unknown>, attrs: Record<string, string> = {}) => {
      const b = h('button', { type: 'button', ...attrs }, label);
      b.addEventListener('click', async () => {
        b.disabled = true;
        err.clear();
        try {
          await run();
          await load();
        } catch (e) {
          err.show(e);
        } finally {
          b.disabled = false;
        }
      });
      return b;
    };
    const forkCount = h('input', { type: 'number', id: 'fork-count', min: 1, max: 64, value: 1, size: 3, 'aria-label': 'Number of children' });
    const extendBy = h('input', { type: 'number', id: 'extend-secs', min: 1, value: 600, size: 6, 'aria-label': 'Seconds from now' });
    const confirmDelete = h('span', { class: 'confirm', hidden: true, role: 'group', 'aria-label': 'Confirm delete' },
      `Delete ${s.id} and everything in it? `,
      busy('Yes, delete', async () => {
        await api('DELETE', `/v1/sandboxes/${s.id}`);
        location.hash = '#/sandboxes';
      }, { id: 'delete-confirm', class: 'danger' }),
      h('button', { type: 'button', onclick: () => (confirmDelete.hidden = true) }, 'Cancel'),
    );
    const running = s.state === 'running';
    fill(
      actions,
      h('span', { class: 'group' }, forkCount, busy('Fork', () => api('POST', `/v1/sandboxes/${s.id}/fork`, { count: Number(forkCount.value) }), { id: 'fork' })),
      running ? busy('Suspend', () => api('POST', `/v1/sandboxes/${s.id}/suspend`, { keep_memory: true }), { id: 'suspend', title: 'Memory, processes and files kept' }) : null,
      running ? busy('Suspend, files only', () => api('POST', `/v1/sandboxes/${s.id}/suspend`, { keep_memory: false }), { id: 'suspend-files', title: 'Only the files kept: quicker, and the resume boots it afresh' }) : null,
      s.state === 'suspended' ? busy('Resume', () => api('POST', `/v1/sandboxes/${s.id}/resume`), { id: 'resume' }) : null,
      running ? h('span', { class: 'group' }, extendBy, busy('Set timeout', () => api('POST', `/v1/sandboxes/${s.id}/timeout`, { timeout_secs: Number(extendBy.value) }), { id: 'extend' })) : null,
      h('button', { type: 'button', id: 'delete', class: 'danger', onclick: () => ((confirmDelete.hidden = false), (confirmDelete.querySelector('button') as HTMLButtonElement).focus()) }, 'Delete…'),
      confirmDelete,
    );
  }

  // ---- lineage ---------------------------------------------------------------------------------

  /** The whole tree this sandbox belongs to: up to the oldest ancestor still there, then all its descendants. */
  const loadTree = async () => {
    try {
      const all = new Map((await allSandboxes()).map((s) => [s.id, s]));
      let rootId = sandboxId;
      if (!all.has(rootId)) return fill(tree, h('p', { class: 'muted' }, '—'));
      for (let s = all.get(rootId); s?.parent && all.has(s.parent); s = all.get(rootId)) rootId = s.parent;
      const kids = new Map<string, Sandbox[]>();
      for (const s of all.values()) if (s.parent && all.has(s.parent)) kids.set(s.parent, [...(kids.get(s.parent) ?? []), s]);
      const node = (s: Sandbox): HTMLLIElement => {
        const children = (kids.get(s.id) ?? []).sort((a, b) => a.created_at.localeCompare(b.created_at));
        const here = s.id === sandboxId;
        return h('li', { 'data-tree-node': s.id },
          h('a', { href: `#/sandboxes/${s.id}`, 'aria-current': here ? 'page' : undefined, class: here ? 'here' : undefined }, s.id),
          ' ', h('span', { class: `state ${s.state}` }, s.state),
          s.forked_at ? h('span', { class: 'muted' }, ` forked ${new Date(s.forked_at).toLocaleTimeString()}`) : null,
          children.length ? h('ul', {}, ...children.map(node)) : null,
        );
      };
      const rootNode = all.get(rootId)!;
      fill(tree, rootNode.parent ? h('p', { class: 'muted' }, `(forked from ${rootNode.parent}, since deleted)`) : null, h('ul', {}, node(rootNode)));
      await showProvenance(all.get(sandboxId)!.from_snapshot, all);
    } catch (e) {
      err.show(e);
    }
  };

  /** Where the snapshot this sandbox came from (or was last rolled back to) was taken. Snapshots do not change, so each is read once. */
  const snapshotCache = new Map<string, Snapshot | null>();
  async function showProvenance(snapshotId: string | null, all: Map<string, Sandbox>): Promise<void> {
    provenance.hidden = !snapshotId;
    if (!snapshotId) return;
    if (!snapshotCache.has(snapshotId)) {
      try {
        snapshotCache.set(snapshotId, await api<Snapshot>('GET', `/v1/snapshots/${snapshotId}`));
      } catch (e) {
        if ((e as { code?: string }).code !== 'snapshot_not_found') throw e;
        snapshotCache.set(snapshotId, null);
      }
    }
    const snap = snapshotCache.get(snapshotId);
    const label = h('code', {}, snap?.name ?? snapshotId);
    if (!snap) return fill(provenance, 'From snapshot ', label, h('span', { class: 'muted' }, ' (since deleted)'));
    if (snap.sandbox_id === sandboxId) return fill(provenance, 'Rolled back to its snapshot ', label, ` of ${new Date(snap.created_at).toLocaleString()}`);
    fill(provenance, 'Started from snapshot ', label, ' of ',
      all.has(snap.sandbox_id) ? h('a', { href: `#/sandboxes/${snap.sandbox_id}` }, snap.sandbox_id) : h('span', { class: 'muted' }, `${snap.sandbox_id} (since deleted)`),
      ` taken ${new Date(snap.created_at).toLocaleString()}`);
  }

  // ---- snapshots -------------------------------------------------------------------------------

  function snapshotForm(): HTMLFormElement {
    const name = h('input', { id: 'snapshot-name', placeholder: 'name (optional)', size: 20, maxlength: 128, 'aria-label': 'Snapshot name' });
    const take = h('button', { type: 'submit', id: 'take-snapshot' }, 'Take snapshot');
    return h('form', { class: 'inline', onsubmit: async (e: Event) => {
      e.preventDefault();
      take.disabled = true;
      err.clear();
      try {
        await takeSnapshot(sandboxId, name.value.trim() || undefined);
        name.value = '';
        await loadSnapshots();
      } catch (e2) {
        err.show(e2);
      } finally {
        take.disabled = false;
      }
    } }, name, take);
  }

  /** This sandbox's snapshots; re-rendered only when they or the sandbox's state change, so open confirmations and typed counts survive the live updates. */
  let shownSnapshots = '';
  async function loadSnapshots(): Promise<void> {
    try {
      const list = await allSnapshots(sandboxId);
      const self = !gone && current ? current : null;
      const key = JSON.stringify([list.map((s) => s.id), self?.state]);
      if (key === shownSnapshots) return;
      shownSnapshots = key;
      fill(snapshots, snapshotTable(list, {
        sandboxes: new Map(self ? [[self.id, self]] : []),
        showSource: false,
        fail: (e) => err.show(e),
        before: () => err.clear(),
        after: () => load(),
      }));
    } catch (e) {
      err.show(e);
    }
  }

  // ---- exec ------------------------------------------------------------------------------------


  function execForm(): HTMLFormElement {
    const input = h('input', { id: 'exec-command', placeholder: 'uname -a', size: 50, 'aria-label': 'Command' });
    const run = h('button', { type: 'submit' }, 'Run');
    return h('form', { class: 'inline', onsubmit: async (e: Event) => {
      e.preventDefault();
      const command = input.value.trim();
      if (!command) return;
      run.disabled = true;
      err.clear();
      try {
        const r = await api<{ stdout: string; stderr: string; stdout_encoding: string; exit_code: number }>('POST', `/v1/sandboxes/${sandboxId}/exec`, { command });
        const stdout = r.stdout_encoding === 'utf8' ? r.stdout : `(${r.stdout.length} base64 characters)`;
        execOut.textContent = stdout + (r.stderr ? `\n[stderr]\n${r.stderr}` : '');
        execOut.dataset.exit = String(r.exit_code);
        void load();
      } catch (e2) {
        err.show(e2);
      } finally {
        run.disabled = false;
      }
    } }, input, run);
  }

  /** The recent execs the server keeps: from this page, the API, the SDKs or MCP alike. */
  async function loadExecs(): Promise<void> {
    if (gone) return;
    try {
      const r = await api<{ execs: ExecEntry[] }>('GET', `/v1/sandboxes/${sandboxId}/execs?limit=20`);
      fill(execList, ...r.execs.map((e) =>
        h('tr', {}, h('td', {}, h('code', {}, e.command)), h('td', {}, e.timed_out ? 'timed out' : e.exit_code), h('td', {}, `${e.duration_ms} ms`), h('td', {}, new Date(e.started_at).toLocaleTimeString()))));
    } catch { /* the sandbox went: load() says so */ }
  }

  // ---- terminal --------------------------------------------------------------------------------

  async function toggleTerminal(): Promise<void> {
    const button = main.querySelector<HTMLButtonElement>('#open-terminal')!;
    if (terminal) {
      terminal.close();
      terminal = null;
      button.textContent = 'Open terminal';
      terminalBox.replaceChildren();
      return;
    }
    button.disabled = true;
    try {
      terminal = await openTerminal(terminalBox, sandboxId, () => {});
      button.textContent = 'Close terminal';
    } catch (e) {
      err.show(e);
    } finally {
      button.disabled = false;
    }
  }

  // ---- files -----------------------------------------------------------------------------------

  let dir = '/root';
  const loadFiles = async () => {
    const pathInput = h('input', { id: 'files-path', value: dir, size: 40, 'aria-label': 'Directory' });
    const upload = h('input', { type: 'file', id: 'upload', 'aria-label': 'Upload a file to this directory' });
    const listing = h('tbody');
    const ferr = errorBox();
    upload.addEventListener('change', async () => {
      const file = upload.files?.[0];
      if (!file) return;
      try {
        await apiBytes('PUT', `/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent(join(dir, file.name))}`, file);
        await loadFiles();
        main.querySelector<HTMLElement>('#files')!.dataset.uploaded = file.name;
      } catch (e) {
        ferr.show(e);
      }
    });
    fill(files,
      h('form', { class: 'inline', onsubmit: (e: Event) => (e.preventDefault(), (dir = pathInput.value || '/'), void loadFiles()) },
        pathInput, h('button', { type: 'submit' }, 'List'), h('label', { class: 'upload' }, 'Upload: ', upload)),
      ferr.el,
      h('table', { class: 'list' }, h('thead', {}, h('tr', {}, ...['Name', 'Type', 'Size', ''].map((c) => h('th', { scope: 'col' }, c)))), listing),
    );
    if (current?.state !== 'running') return fill(listing, h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'Files are browsable while the sandbox runs.')));
    try {
      const r = await api<{ entries: Array<{ name: string; type: string; size: number; path: string }> }>('GET', `/v1/sandboxes/${sandboxId}/fs/list?path=${encodeURIComponent(dir)}`);
      const parent = dir === '/' ? null : dir.replace(/\/[^/]+\/?$/, '') || '/';
      fill(listing,
        parent ? h('tr', {}, h('td', {}, h('button', { type: 'button', class: 'link', onclick: () => ((dir = parent), void loadFiles()) }, '..')), h('td', {}, 'dir'), h('td', {}), h('td', {})) : null,
        ...r.entries.sort((a, b) => a.name.localeCompare(b.name)).map((f) => h('tr', { 'data-file': f.name },
          h('td', {}, f.type === 'dir' ? h('button', { type: 'button', class: 'link', onclick: () => ((dir = join(dir, f.name)), void loadFiles()) }, f.name + '/') : f.name),
          h('td', {}, f.type), h('td', {}, f.type === 'file' ? String(f.size) : ''),
          h('td', {}, f.type === 'file' ? h('button', { type: 'button', onclick: () => void download(join(dir, f.name), f.name) }, 'Download') : null),
        )),
      );
    } catch (e) {
      ferr.show(e);
    }
  };

  async function download(path: string, name: string): Promise<void> {
    try {
      const blob = await apiBlob(`/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent(path)}`);
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      err.show(e);
    }
  }

  // ---- ports -----------------------------------------------------------------------------------

  function renderPorts(s: Sandbox): void {
    if (!s.ports.length) return fill(ports, h('p', { class: 'muted' }, s.state === 'running' ? 'No server listens on a TCP port.' : '—'));
    fill(ports, h('ul', {}, ...s.ports.map((p) => {
      const out = h('span');
      return h('li', {}, `${p.port}/tcp `, h('button', { type: 'button', onclick: async () => {
        try {
          const u = await api<{ url: string; expires_at: string }>('POST', `/v1/sandboxes/${s.id}/port-urls`, { port: p.port });
          const href = new URL(u.url, location.origin).toString();
          fill(out, ' ', h('a', { href, target: '_blank', rel: 'noopener' }, href), h('span', { class: 'muted' }, ` until ${new Date(u.expires_at).toLocaleTimeString()}`));
        } catch (e) {
          err.show(e);
        }
      } }, 'Signed URL'), out);
    })));
  }

  const stop = followSandboxes(() => {
    if (gone) return;
    const before = current?.state;
    void load().then(() => {
      if (current?.state !== before) void loadFiles();
    });
  }, () => void load().then(loadFiles));
  return () => {
    stop();
    metrics.close();
    code.close();
    terminal?.close();
  };
};

function join(dir: string, name: string): string {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`;
}

