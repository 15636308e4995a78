/** The tenant's API keys: list, create (the key shown once), revoke (confirmed). */
import { api, storedKey } from '../api.js';
import { errorBox, fill, h } from '../dom.js';
import type { Page } from '../app.js';

interface KeyView { id: string; prefix: string; name: string | null; created_at: string; last_used_at: string | null }

export const keysPage: Page = (main) => {
  const err = errorBox();
  const body = h('tbody', { id: 'keys' });
  const created = h('div', { id: 'created-key', 'aria-live': 'polite' });
  const name = h('input', { id: 'key-name', placeholder: 'name (optional)', maxlength: 100, 'aria-label': 'Key name' });

  const load = async () => {
    try {
      const r = await api<{ keys: KeyView[] }>('GET', '/v1/keys');
      const mine = storedKey()?.slice(0, 12);
      fill(body, ...r.keys.map((k) => {
        const confirm = h('span', { class: 'confirm', hidden: true },
          'Revoke? Programs using it stop working. ',
          h('button', { type: 'button', class: 'danger', 'data-revoke-confirm': k.id, onclick: async () => {
            try {
              await api('DELETE', `/v1/keys/${k.id}`);
              await load();
            } catch (e) {
              err.show(e);
            }
          } }, 'Yes, revoke'),
          h('button', { type: 'button', onclick: () => (confirm.hidden = true) }, 'Cancel'));
        return h('tr', { 'data-key': k.id },
          h('td', {}, h('code', {}, `${k.prefix}…`), k.prefix === mine ? h('span', { class: 'muted' }, ' (this session)') : null),
          h('td', {}, k.name ?? '—'),
          h('td', {}, new Date(k.created_at).toLocaleString()),
          h('td', {}, k.last_used_at ? new Date(k.last_used_at).toLocaleString() : 'never'),
          h('td', {}, h('button', { type: 'button', 'data-revoke': k.id, onclick: () => ((confirm.hidden = false), (confirm.querySelector('button') as HTMLButtonElement).focus()) }, 'Revoke…'), confirm),
        );
      }));
    } catch (e) {
      err.show(e);
    }
  };

  fill(main,
    h('h1', {}, 'API keys'),
    err.el,
    h('form', { class: 'inline', onsubmit: async (e: Event) => {
      e.preventDefault();
      try {
        const r = await api<{ key: string; record: KeyView }>('POST', '/v1/keys', name.value.trim() ? { name: name.value.trim() } : {});
        name.value = '';
        fill(created, h('p', { class: 'notice' }, 'New key (shown only now; copy it): ', h('code', { id: 'new-key' }, r.key)));
        await load();
      } catch (e2) {
        err.show(e2);
      }
    } }, name, h('button', { type: 'submit' }, 'Create key')),
    created,
    h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ...['Key', 'Name', 'Created', 'Last used', ''].map((c) => h('th', { scope: 'col' }, c)))),
      body),
  );
  void load();
  return () => {};
};
