/**
 * What the sandbox page's Code panel shows of a cell (POST /v1/sandboxes/{id}/code): its result, or
 * the part of it streamed so far, as render pieces. Pure, so it is tested outside a browser; the page
 * turns each piece into elements (pages/code.ts).
 *
 * Every byte here is the sandbox's: text is only ever text, images only ever <img> data URLs (an
 * image cannot run script), and HTML only ever the srcdoc of an iframe sandboxed with no
 * permissions, never markup in the console's own document, which holds the API key.
 */

/** One output of a cell, as the API sends it: a MIME bundle. */
export interface CodeOutput { is_main_result: boolean; data: Record<string, unknown> }
export interface CodeError { name: string; value: string; traceback: string }
/** A cell's result (the API's CodeResult), or what the stream has delivered of it so far. */
export interface CellState {
  results: CodeOutput[];
  stdout: string;
  stderr: string;
  error: CodeError | null;
  execution_count: number | null;
  timed_out: boolean;
}

export type CodePiece =
  | { kind: 'stdout' | 'stderr'; text: string }
  | { kind: 'text'; text: string; main: boolean }
  | { kind: 'image'; src: string; alt: string; main: boolean }
  | { kind: 'html'; html: string; main: boolean }
  | { kind: 'error'; name: string; value: string; traceback: string }
  | { kind: 'note'; text: string };

export function emptyCell(): CellState {
  return { results: [], stdout: '', stderr: '', error: null, execution_count: null, timed_out: false };
}

const BASE64 = /^[A-Za-z0-9+/=\s]+$/;

/** One piece per output, its richest form as a notebook picks it: image, then SVG, then HTML, then text. */
function outputPiece(out: CodeOutput): CodePiece | null {
  const d = out.data;
  const str = (mime: string) => (typeof d[mime] === 'string' ? (d[mime] as string) : undefined);
  const plain = str('text/plain') ?? '';
  const main = out.is_main_result;
  for (const mime of ['image/png', 'image/jpeg']) {
    const b64 = str(mime);
    if (b64 && BASE64.test(b64)) return { kind: 'image', src: `data:${mime};base64,${b64.replace(/\s/g, '')}`, alt: plain || mime, main };
  }
  const svg = str('image/svg+xml');
  if (svg) return { kind: 'image', src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`, alt: plain || 'image/svg+xml', main };
  const html = str('text/html');
  if (html) return { kind: 'html', html, main };
  if (plain) return { kind: 'text', text: plain, main };
  const other = Object.keys(d);
  return other.length ? { kind: 'note', text: `(an output of type ${other.join(', ')}, not shown here)` } : null;
}

export function cellPieces(cell: CellState): CodePiece[] {
  const pieces: CodePiece[] = [];
  if (cell.stdout) pieces.push({ kind: 'stdout', text: cell.stdout });
  if (cell.stderr) pieces.push({ kind: 'stderr', text: cell.stderr });
  for (const out of cell.results) {
    const p = outputPiece(out);
    if (p) pieces.push(p);
  }
  if (cell.error) pieces.push({ kind: 'error', ...cell.error });
  if (cell.timed_out) pieces.push({ kind: 'note', text: 'The cell ran past its timeout and was interrupted.' });
  return pieces;
}

/** A cell's stream event (the SSE events of POST /code) folded into what is shown so far; `result` replaces it all. */
export function applyCodeEvent(cell: CellState, event: string, data: any): CellState {
  switch (event) {
    case 'stdout': return { ...cell, stdout: cell.stdout + String(data.text) };
    case 'stderr': return { ...cell, stderr: cell.stderr + String(data.text) };
    case 'display': return { ...cell, results: [...cell.results, data as CodeOutput] };
    case 'exception': return { ...cell, error: data as CodeError };
    case 'result': return data as CellState;
    default: return cell;
  }
}
