/**
 * A table of snapshots with their actions, shared by the sandbox page (that sandbox's snapshots) and
 * the sandboxes page (all of the tenant's): start 1..N sandboxes from one, roll its sandbox back to it
 * (confirmed: the sandbox's current state is discarded), delete it (confirmed).
 */
import { deleteSnapshot, rollBack, startFromSnapshot, type Sandbox, type Snapshot } from '../api.js';
import { bytes, fill, h } from '../dom.js';

export interface SnapshotTableOptions {
  /** The sandboxes that still exist, by id: a snapshot's source links to its sandbox only while it exists. */
  sandboxes: Map<string, Sandbox>;
  /** Show the source sandbox column (the tenant-wide list does; one sandbox's own list need not). */
  showSource: boolean;
  /** Shows an action's error (the API's code and message). */
  fail(err: unknown): void;
  /** Called before an action runs (clear the error line) and after it succeeded (reload). */
  before(): void;
  after(): Promise<void> | void;
}

export function snapshotTable(list: Snapshot[], o: SnapshotTableOptions): HTMLTableElement {
  const cols = ['Snapshot', ...(o.showSource ? ['Source sandbox'] : []), 'Taken', 'Size', 'Actions'];
  const body = h('tbody');
  if (!list.length) body.append(h('tr', {}, h('td', { colspan: cols.length, class: 'muted' }, 'No snapshots.')));
  for (const s of list) body.append(row(s, o));
  return h('table', { class: 'list snapshots' }, h('thead', {}, h('tr', {}, ...cols.map((c) => h('th', { scope: 'col' }, c)))), body);
}

function row(s: Snapshot, o: SnapshotTableOptions): HTMLTableRowElement {
  const source = o.sandboxes.get(s.sandbox_id);
  const started = h('span', { class: 'started', role: 'status' });
  const act = (label: string, run: () => Promise<unknown>, attrs: Record<string, string>, reload = true) => {
    const b = h('button', { type: 'button', ...attrs }, label);
    b.addEventListener('click', async () => {
      b.disabled = true;
      o.before();
      try {
        await run();
        const asked = b.closest<HTMLElement>('.confirm');
        if (asked) asked.hidden = true;
        if (reload) await o.after();
      } catch (e) {
        o.fail(e);
      } finally {
        b.disabled = false;
      }
    });
    return b;
  };
  const confirm = (question: string, yes: HTMLButtonElement) => {
    const box = h('span', { class: 'confirm', hidden: true, role: 'group', 'aria-label': question }, question + ' ', yes,
      h('button', { type: 'button', onclick: () => (box.hidden = true) }, 'Cancel'));
    const open = () => ((box.hidden = false), yes.focus());
    return { box, open };
  };

  const count = h('input', { type: 'number', class: 'start-count', min: 1, max: 64, value: 1, size: 3, 'aria-label': `Sandboxes to start from ${s.id}` });
  const start = act('Start from it', async () => {
    const sandboxes = await startFromSnapshot(s.id, Number(count.value) || 1);
    fill(started, ' Started ', ...sandboxes.flatMap((x, i) => [i ? ', ' : '', h('a', { href: `#/sandboxes/${x.id}` }, x.id)]));
  }, { class: 'start' }, false); // the snapshot is unchanged; a reload would drop the links just shown

  // Only its own sandbox may roll back to a snapshot, and only while that sandbox is running or suspended.
  const canRollBack = source && (source.state === 'running' || source.state === 'suspended');
  const rollback = canRollBack
    ? confirm(`Roll ${s.sandbox_id} back to ${s.name ?? s.id}? Its current memory, processes and files are discarded.`,
      act('Yes, roll back', () => rollBack(s.sandbox_id, s.id), { class: 'danger rollback-confirm' }))
    : null;
  const del = confirm(`Delete snapshot ${s.name ?? s.id}?`,
    act('Yes, delete', () => deleteSnapshot(s.id), { class: 'danger delete-snapshot-confirm' }));

  return h(
    'tr', { 'data-snapshot': s.id },
    h('td', {}, s.name ? h('span', {}, s.name, h('br'), h('code', { class: 'muted' }, s.id)) : h('code', {}, s.id)),
    o.showSource
      ? h('td', {}, source ? h('a', { href: `#/sandboxes/${s.sandbox_id}` }, s.sandbox_id) : h('span', { class: 'muted' }, `${s.sandbox_id} (deleted)`))
      : null,
    h('td', {}, new Date(s.created_at).toLocaleString()),
    h('td', {}, bytes(s.size_bytes)),
    h('td', {}, h('div', { class: 'actions' },
      h('span', { class: 'group' }, count, start),
      rollback ? h('button', { type: 'button', class: 'danger rollback', onclick: rollback.open }, 'Roll back…') : null,
      rollback?.box,
      h('button', { type: 'button', class: 'danger delete-snapshot', onclick: del.open }, 'Delete…'),
      del.box,
      started,
    )),
  );
}
