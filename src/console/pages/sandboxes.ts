/** The sandboxes list: state, template, age, idle, execs, live CPU and memory, size, labels; filtered by state and label; live from /v1/events. */
import { allSandboxes, api, type Sandbox } from '../api.js';
import { duration, errorBox, fill, h } from '../dom.js';
import type { Page } from '../app.js';
import { followSandboxes } from './live.js';

export const sandboxesPage: Page = (main) => {
  const err = errorBox();
  const state = h('select', { id: 'filter-state' }, h('option', { value: '' }, 'any'), h('option', { value: 'running' }, 'running'), h('option', { value: 'suspended' }, 'suspended'));
  const label = h('input', { id: 'filter-label', placeholder: 'key=value', size: 18 });
  const body = h('tbody');
  const count = h('span', { class: 'muted', 'aria-live': 'polite' });
  const template = h('select', { id: 'new-template', 'aria-label': 'Template' });
  const createButton = h('button', { type: 'submit' }, 'Create sandbox');

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
      h('thead', {}, h('tr', {}, ...['Id', 'State', 'Template', 'Age', 'Idle', 'Execs', 'CPU', 'Memory', 'Size', 'Labels', 'Parent'].map((c) => h('th', { scope: 'col' }, c)))),
      body,
    ),
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
    h('td', {}, s.parent ? h('a', { href: `#/sandboxes/${s.parent}` }, s.parent) : '—'),
  );
}
