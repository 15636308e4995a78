/**
 * The sandboxes list: state, template, age, idle, execs, live CPU and memory, size, labels, parent or
 * source snapshot; filtered by state and label; live from /v1/events. Below it, the tenant's
 * snapshots with the sandbox each was taken of (which may be gone: snapshots outlive it).
 */
import { allSandboxes, allSnapshots, api, type Sandbox } from '../api.js';
import { duration, errorBox, fill, h } from '../dom.js';
import type { Page } from '../app.js';
import { followSandboxes } from './live.js';
import { snapshotTable } from './snapshots.js';

export const sandboxesPage: Page = (main) => {
  const err = errorBox();
  const state = h('select', { id: 'filter-state' }, h('option', { value: '' }, 'any'), h('option', { value: 'running' }, 'running'), h('option', { value: 'suspended' }, 'suspended'));
  const label = h('input', { id: 'filter-label', placeholder: 'key=value', size: 18 });
  const body = h('tbody');
  const count = h('span', { class: 'muted', 'aria-live': 'polite' });
  const template = h('select', { id: 'new-template', 'aria-label': 'Template' });
  const createButton = h('button', { type: 'submit' }, 'Create sandbox');
  const snapshots = h('div', { id: 'snapshots' });

  let generation = 0;
  const load = async () => {
    const mine = ++generation;
    const q = new URLSearchParams();
    if (state.value) q.set('state', state.value);
    if (label.value.trim()) q.set('label', label.value.trim());
    try {
      const list = await allSandboxes(q.toString());
      if (mine !== generation) return; // a later load is on its way
      err.clear();
      fill(body, ...list.map(row));
      void loadStats();
      void loadSnapshots(q.toString() ? null : list);
      count.textContent = `${list.length} sandbox${list.length === 1 ? '' : 'es'}`;
    } catch (e) {
      err.show(e);
    }
  };

  /** Live CPU and memory of every running sandbox, one request for the whole list. */
  const loadStats = async () => {
    try {
      const r = await api<{ sandboxes: Array<{ id: string; cpu_percent: number | null; memory_mib: number }> }>('GET', '/v1/stats');
      for (const s of r.sandboxes) {
        const tr = body.querySelector(`tr[data-sandbox="${s.id}"]`);
        if (!tr) continue;
        tr.querySelector('.cpu')!.textContent = s.cpu_percent === null ? '…' : `${s.cpu_percent}%`;
        tr.querySelector('.mem')!.textContent = `${s.memory_mib} MiB`;
      }
    } catch { /* the list says what is wrong */ }
  };
  /**
   * Every snapshot of the tenant, with its source sandbox linked while that exists. `unfiltered` is
   * the whole sandbox list when the table shows it, saving a second read. Re-rendered only when
   * something shown changed, so open confirmations and typed counts survive the live updates.
   */
  let shownSnapshots = '';
  const loadSnapshots = async (unfiltered: Sandbox[] | null) => {
    try {
      const [list, sandboxes] = await Promise.all([allSnapshots(), unfiltered ?? allSandboxes()]);
      const byId = new Map(sandboxes.map((s) => [s.id, s]));
      const key = JSON.stringify(list.map((s) => [s.id, byId.get(s.sandbox_id)?.state]));
      if (key === shownSnapshots) return;
      shownSnapshots = key;
      fill(snapshots, snapshotTable(list, {
        sandboxes: byId,
        showSource: true,
        fail: (e) => err.show(e),
        before: () => err.clear(),
        after: () => load(),
      }));
    } catch (e) {
      err.show(e);
    }
  };

  const statsTimer = setInterval(() => void loadStats(), 5000);

  const filters = h(
    'form',
    { class: 'filters', role: 'search', onsubmit: (e: Event) => (e.preventDefault(), void load()) },
    h('label', { for: 'filter-state' }, 'State'), state,
    h('label', { for: 'filter-label' }, 'Label'), label,
    h('button', { type: 'submit' }, 'Filter'),
  );
  state.addEventListener('change', () => void load());

  const create = h('form', { class: 'inline', onsubmit: async (e: Event) => {
    e.preventDefault();
    createButton.disabled = true;
    try {
      const sbx = await api<Sandbox>('POST', '/v1/sandboxes', { template: template.value });
      location.hash = `#/sandboxes/${sbx.id}`;
    } catch (e2) {
      err.show(e2);
    } finally {
      createButton.disabled = false;
    }
  } }, template, createButton);
  void api<{ templates: Array<{ id: string; ready: boolean }> }>('GET', '/v1/templates').then((r) =>
    fill(template, ...r.templates.filter((t) => t.ready).map((t) => h('option', { value: t.id }, t.id))),
  ).catch((e) => err.show(e));

  fill(
    main,
    h('h1', {}, 'Sandboxes'),
    h('div', { class: 'toolbar' }, filters, create),
    err.el,
    count,
    h(
      'table', { class: 'list', id: 'sandboxes' },
      h('thead', {}, h('tr', {}, ...['Id', 'State', 'Template', 'Age', 'Idle', 'Execs', 'CPU', 'Memory', 'Size', 'Labels', 'Parent / snapshot'].map((c) => h('th', { scope: 'col' }, c)))),
      body,
    ),
    h('section', { 'aria-labelledby': 'h-snapshots' }, h('h2', { id: 'h-snapshots' }, 'Snapshots'), snapshots),
  );

  // The stream first, then the list: nothing that changes in between is missed.
  const stop = followSandboxes(() => void load(), () => void load());
  return () => {
    stop();
    clearInterval(statsTimer);
  };
};

function row(s: Sandbox): HTMLTableRowElement {
  return h(
    'tr', { 'data-sandbox': s.id, 'data-state': s.state },
    h('td', {}, h('a', { href: `#/sandboxes/${s.id}` }, s.id)),
    h('td', {}, h('span', { class: `state ${s.state}` }, s.state)),
    h('td', {}, s.template),
    h('td', {}, duration(s.age_secs)),
    h('td', {}, duration(s.idle_secs)),
    h('td', {}, s.exec_count),
    h('td', { class: 'cpu' }, '—'),
    h('td', { class: 'mem' }, '—'),
    h('td', {}, `${s.vcpus} vCPU · ${s.memory_mib} MiB`),
    h('td', {}, ...Object.entries(s.labels).map(([k, v]) => h('span', { class: 'label' }, `${k}=${v}`))),
    h('td', {}, s.parent ? h('a', { href: `#/sandboxes/${s.parent}` }, s.parent) : s.from_snapshot ? h('span', { class: 'muted', title: 'Started from (or rolled back to) this snapshot' }, s.from_snapshot) : '—'),
  );
}
