/**
 * The console's shell: the sign-in page, the navigation and a hash router over the pages. Each page
 * renders into <main> and returns its clean-up (event streams closed, terminals disposed).
 */
import { api, forgetKey, storedKey, storeKey, whenUnauthorized } from './api.js';
import { errorBox, fill, h } from './dom.js';
import { sandboxesPage } from './pages/sandboxes.js';
import { sandboxPage } from './pages/sandbox.js';
import { templatesPage } from './pages/templates.js';
import { usagePage } from './pages/usage.js';
import { keysPage } from './pages/keys.js';

export type Cleanup = () => void;
export type Page = (main: HTMLElement, arg: string | undefined) => Cleanup;

const root = document.getElementById('app')!;
let cleanup: Cleanup = () => {};

const NAV: Array<[string, string]> = [
  ['#/sandboxes', 'Sandboxes'],
  ['#/templates', 'Templates & environments'],
  ['#/usage', 'Usage'],
  ['#/keys', 'Keys'],
];

function signOut(reason?: string): void {
  cleanup();
  cleanup = () => {};
  forgetKey();
  signInPage(reason);
}

function signInPage(notice?: string): void {
  const err = errorBox();
  const input = h('input', { id: 'key', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'clm_…', required: true });
  const form = h(
    'form',
    { class: 'signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Collimate console'),
    notice ? h('p', { class: 'notice', role: 'status' }, notice) : null,
    h('label', { for: 'key' }, 'API key'),
    input,
    h('button', { type: 'submit' }, 'Sign in'),
    err.el,
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.clear();
    const key = input.value.trim();
    storeKey(key);
    try {
      // The key is checked by asking for something every key may see.
      await api('GET', '/v1/limits');
      if (!location.hash || location.hash === '#/') location.hash = '#/sandboxes';
      shell();
    } catch (e2) {
      forgetKey();
      err.show(e2);
    }
  });
  fill(root, form);
  input.focus();
}

function shell(): void {
  const main = h('main', { id: 'main', tabindex: '-1' });
  const nav = h(
    'nav',
    { 'aria-label': 'Console' },
    h('span', { class: 'brand' }, 'Collimate'),
    ...NAV.map(([href, label]) => h('a', { href, 'data-nav': href }, label)),
    h('button', { type: 'button', class: 'signout', onclick: () => signOut('Signed out.') }, 'Sign out'),
  );
  fill(root, h('header', {}, nav), main);
  route(main);
}

function route(main: HTMLElement): void {
  cleanup();
  const [, page, arg] = /^#\/([a-z]+)(?:\/(.+))?$/.exec(location.hash) ?? [];
  const render: Page =
    page === 'sandboxes' && arg ? sandboxPage : page === 'templates' ? templatesPage : page === 'usage' ? usagePage : page === 'keys' ? keysPage : sandboxesPage;
  for (const a of root.querySelectorAll<HTMLAnchorElement>('nav a')) {
    const current = location.hash.startsWith(a.dataset.nav ?? '-') || (!page && a.dataset.nav === '#/sandboxes');
    if (current) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.replaceChildren();
  cleanup = render(main, arg ? decodeURIComponent(arg) : undefined);
}

whenUnauthorized(() => {
  if (storedKey()) signOut('Your key was refused (revoked or unknown); sign in again.');
});

window.addEventListener('hashchange', () => {
  const main = document.getElementById('main');
  if (main && storedKey()) route(main);
});

if (storedKey()) shell();
else signInPage();
