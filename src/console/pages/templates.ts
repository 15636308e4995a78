/**
 * Templates and environments: the catalog, the tenant's own images, its environments with their bake
 * state and bake log (streamed while baking), and a form to create an environment from an image
 * with an egress policy and write-only secrets.
 */
import { api, streamEvents } from '../api.js';
import { errorBox, fill, h } from '../dom.js';
import type { Page } from '../app.js';

interface Template { id: string; kind: string; description: string; ready: boolean; vcpus: number; memory_mib: number; runtimes: Record<string, string> }
interface Image { id: string; ref: string; state: string; error: string | null }
interface Environment { name: string; image: string; state: string; error: string | null; progress: string | null; secret_names: string[]; vcpus: number; memory_mib: number }

export const templatesPage: Page = (main) => {
  const err = errorBox();
  const catalog = h('tbody', { id: 'catalog' });
  const images = h('tbody', { id: 'images' });
  const envs = h('tbody', { id: 'environments' });
  const log = h('pre', { class: 'output log', id: 'bake-log', 'aria-live': 'polite', tabindex: 0 });
  const logTitle = h('h3', { id: 'bake-log-title' }, 'Bake log');
  let following: AbortController | null = null;

  /** Streams the environment's bake log into the page until the bake is over (or another is followed). */
  const follow = async (name: string) => {
    following?.abort();
    const abort = new AbortController();
    following = abort;
    logTitle.textContent = `Bake log: ${name}`;
    log.textContent = '';
    delete log.dataset.state;
    try {
      await streamEvents(`/v1/environments/${encodeURIComponent(name)}/log`, (event, data) => {
        if (event === 'log') {
          const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          log.textContent = data.reset ? data.text : (log.textContent ?? '') + data.text;
          if (atEnd) log.scrollTop = log.scrollHeight;
        } else if (event === 'end') {
          log.dataset.state = data.state;
          void load();
        }
      }, { signal: abort.signal });
    } catch (e) {
      if (!abort.signal.aborted) err.show(e);
    }
  };

  const load = async () => {
    try {
      const [t, i, e] = await Promise.all([
        api<{ templates: Template[] }>('GET', '/v1/templates'),
        api<{ images: Template[]; own: Image[] }>('GET', '/v1/images'),
        api<{ environments: Environment[] }>('GET', '/v1/environments'),
      ]);
      fill(catalog, ...t.templates.filter((x) => x.kind === 'catalog').map((x) => h('tr', {},
        h('td', {}, x.id), h('td', {}, x.description), h('td', {}, Object.entries(x.runtimes).map(([k, v]) => `${k} ${v}`).join(', ') || '—'),
        h('td', {}, `${x.vcpus} vCPU · ${x.memory_mib} MiB`), h('td', {}, x.ready ? 'ready' : 'warming'))));
      fill(images, ...(i.own.length ? i.own.map((x) => h('tr', {}, h('td', {}, x.ref), h('td', {}, h('code', {}, x.id.slice(0, 19) + '…')), h('td', {}, x.state), h('td', {}, x.error ?? '')))
        : [h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'No images of your own (POST /v1/images registers one).'))]));
      fill(imageSelect, ...i.own.filter((x) => x.state === 'ready').map((x) => h('option', { value: x.id }, x.ref)));
      fill(envs, ...(e.environments.length ? e.environments.map((x) => h('tr', { 'data-environment': x.name },
        h('td', {}, x.name), h('td', {}, x.image.slice(0, 19)), h('td', {}, h('span', { class: `state ${x.state}` }, x.state), x.progress ? ` ${x.progress}` : '', x.error ? h('span', { class: 'error' }, ` ${x.error}`) : null),
        h('td', {}, x.secret_names.join(', ') || '—'),
        h('td', {}, h('button', { type: 'button', onclick: () => void follow(x.name) }, 'Log')))) : [h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No environments yet.'))]));
    } catch (e2) {
      err.show(e2);
    }
  };

  // ---- create an environment -------------------------------------------------------------------
  const imageSelect = h('select', { id: 'env-image', required: true });
  const envName = h('input', { id: 'env-name', required: true, pattern: '[a-z0-9][a-z0-9._-]*', placeholder: 'my-env' });
  const ready = h('input', { id: 'env-ready', size: 40, placeholder: 'pip install requests' });
  const egress = h('select', { id: 'env-egress' }, h('option', { value: 'allow' }, 'allow (any public address)'), h('option', { value: 'none' }, 'none'), h('option', { value: 'domains' }, 'only these domains:'));
  const domains = h('input', { id: 'env-domains', size: 30, placeholder: 'pypi.org, *.pythonhosted.org' });
  const secrets = h('textarea', { id: 'env-secrets', rows: 3, cols: 40, placeholder: 'NAME=value, one a line', autocomplete: 'off', spellcheck: 'false' });
  const form = h('form', { class: 'stacked', id: 'create-environment', onsubmit: async (e: Event) => {
    e.preventDefault();
    err.clear();
    const secretMap: Record<string, string> = {};
    for (const line of secrets.value.split('\n')) {
      const eq = line.indexOf('=');
      if (line.trim() && eq > 0) secretMap[line.slice(0, eq).trim()] = line.slice(eq + 1);
    }
    const policy = egress.value === 'domains' ? { domains: domains.value.split(',').map((d) => d.trim()).filter(Boolean) } : egress.value;
    try {
      const env = await api<Environment>('POST', '/v1/environments', {
        name: envName.value.trim(),
        image: imageSelect.value,
        ...(ready.value.trim() ? { ready_command: ready.value.trim() } : {}),
        egress: policy,
        ...(Object.keys(secretMap).length ? { secrets: secretMap } : {}),
      });
      // Secret values leave the page with the request and are never shown again.
      secrets.value = '';
      await load();
      await follow(env.name);
    } catch (e2) {
      err.show(e2);
    }
  } },
    h('label', { for: 'env-name' }, 'Name'), envName,
    h('label', { for: 'env-image' }, 'Image'), imageSelect,
    h('label', { for: 'env-ready' }, 'Ready command'), ready,
    h('label', { for: 'env-egress' }, 'Egress'), h('span', {}, egress, ' ', domains),
    h('label', { for: 'env-secrets' }, 'Secrets (write-only)'), secrets,
    h('span'), h('button', { type: 'submit' }, 'Create environment'),
  );

  fill(main,
    h('h1', {}, 'Templates & environments'),
    err.el,
    h('h2', {}, 'Catalog'),
    h('table', { class: 'list' }, h('thead', {}, h('tr', {}, ...['Id', 'Description', 'Runtimes', 'Size', 'Pool'].map((c) => h('th', { scope: 'col' }, c)))), catalog),
    h('h2', {}, 'Your images'),
    h('table', { class: 'list' }, h('thead', {}, h('tr', {}, ...['Ref', 'Id', 'State', 'Error'].map((c) => h('th', { scope: 'col' }, c)))), images),
    h('h2', {}, 'Your environments'),
    h('table', { class: 'list' }, h('thead', {}, h('tr', {}, ...['Name', 'Image', 'State', 'Secrets', ''].map((c) => h('th', { scope: 'col' }, c)))), envs),
    logTitle, log,
    h('h2', {}, 'Create an environment'),
    form,
  );
  void load();
  return () => following?.abort();
};
