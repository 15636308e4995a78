/**
 * A sandbox's Code panel: one cell run in the sandbox's stateful kernel (POST /v1/sandboxes/{id}/code,
 * streamed as SSE so output shows as the cell prints), in the language's default context, so state
 * carries from one run to the next as in a notebook. Outputs are drawn from codeOutput.ts's pieces:
 * text as text, images as data-URL <img>, HTML only inside an iframe sandboxed with no permissions.
 */
import { streamEvents, type Sandbox } from '../api.js';
import { applyCodeEvent, cellPieces, emptyCell, type CellState, type CodePiece } from '../codeOutput.js';
import { errorBox, fill, h } from '../dom.js';

export interface CodeSection {
  el: HTMLElement;
  /** The sandbox as the page last read it, or null once it is gone: cells run only while it runs. */
  show(sandbox: Sandbox | null): void;
  /** The page is left: a running cell's stream is closed (the server interrupts the cell). */
  close(): void;
}

export function codeSection(sandboxId: string): CodeSection {
  const ferr = errorBox();
  const language = h('select', { id: 'code-language', 'aria-label': 'Language' }, h('option', { value: 'python' }, 'Python'), h('option', { value: 'javascript' }, 'JavaScript'));
  const input = h('textarea', { id: 'code-input', rows: 6, spellcheck: 'false', 'aria-label': 'Code', placeholder: 'import numpy as np\nnp.arange(5) ** 2' });
  const run = h('button', { type: 'submit', id: 'code-run' }, 'Run');
  const prompt = h('span', { class: 'prompt', id: 'code-count' }, 'In [ ]:');
  const note = h('span', { class: 'muted' });
  const outputs = h('div', { id: 'code-outputs', class: 'code-outputs', 'aria-live': 'polite', 'data-state': 'idle' });
  let running = false;
  let languageChosen = false;
  let inFlight: AbortController | null = null;

  const form = h('form', { class: 'code-cell', onsubmit: (e: Event) => (e.preventDefault(), void runCell()) },
    h('div', { class: 'inline' }, prompt, language, run, h('span', { class: 'muted' }, 'Ctrl+Enter'), note),
    input,
  );
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      form.requestSubmit();
    }
  });

  async function runCell(): Promise<void> {
    const code = input.value;
    if (!code.trim() || !running || inFlight) return;
    const abort = (inFlight = new AbortController());
    run.disabled = true;
    ferr.clear();
    let cell = emptyCell();
    prompt.textContent = 'In [*]:';
    outputs.dataset.state = 'running';
    fill(outputs);
    try {
      await streamEvents(`/v1/sandboxes/${sandboxId}/code`, (event, data) => {
        if (event === 'error') throw Object.assign(new Error(data.error?.message ?? 'the cell failed'), { code: data.error?.code });
        cell = applyCodeEvent(cell, event, data);
        render(cell);
      }, { signal: abort.signal, method: 'POST', body: { code, language: language.value } });
      prompt.textContent = `In [${cell.execution_count ?? ' '}]:`;
      outputs.dataset.count = String(cell.execution_count ?? '');
      outputs.dataset.state = cell.error ? 'error' : 'done';
    } catch (e) {
      prompt.textContent = 'In [ ]:';
      outputs.dataset.state = 'failed';
      if (!abort.signal.aborted) ferr.show(e);
    } finally {
      inFlight = null;
      run.disabled = !running;
    }
  }

  function render(cell: CellState): void {
    fill(outputs, ...cellPieces(cell).map((p) => pieceElement(p, cell.execution_count)));
  }

  return {
    el: h('div', { id: 'code' }, form, ferr.el, outputs),
    show(s) {
      running = s?.state === 'running';
      run.disabled = !running || inFlight !== null;
      note.textContent = running ? '' : 'Cells run while the sandbox runs.';
      // The node image has only the JavaScript kernel; every other one runs Python first.
      if (s && !languageChosen) {
        language.value = s.template === 'node' ? 'javascript' : 'python';
        languageChosen = true;
      }
    },
    close() {
      inFlight?.abort();
    },
  };
}

function pieceElement(p: CodePiece, count: number | null): HTMLElement {
  const out = (main: boolean, body: HTMLElement) =>
    h('div', { class: 'code-output' }, main ? h('span', { class: 'prompt out' }, `Out[${count ?? ' '}]:`) : null, body);
  switch (p.kind) {
    case 'stdout':
    case 'stderr':
      return h('pre', { class: `output code-${p.kind}` }, p.text);
    case 'text':
      return out(p.main, h('pre', { class: 'output code-text' }, p.text));
    case 'image':
      return out(p.main, h('img', { class: 'code-image', src: p.src, alt: p.alt }));
    case 'html':
      // No permission at all: no script, no forms, an opaque origin that reaches nothing of the console's.
      return out(p.main, h('iframe', { class: 'code-html', sandbox: '', srcdoc: p.html, title: 'HTML output of the cell' }));
    case 'error':
      return h('div', { class: 'code-error', role: 'alert' }, h('strong', {}, `${p.name}: ${p.value}`), p.traceback ? h('pre', { class: 'output' }, p.traceback) : null);
    case 'note':
      return h('p', { class: 'muted' }, p.text);
  }
}
