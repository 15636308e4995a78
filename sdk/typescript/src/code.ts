/**
 * What the code interpreter gives back (`sb.runCode`): the API's CodeResult, whole, plus `text`.
 */
import type { CodeContext, CodeError, CodeOutput, CodeResult } from './types.js';

/** A cell's outcome: its outputs, printed text, exception and counters, as the API sent them. */
export class Execution implements CodeResult {
  /** The context the cell ran in. */
  readonly context: string | null;
  /** Displays and the main value (`is_main_result`), in the order they came. */
  readonly results: CodeOutput[];
  readonly stdout: string;
  readonly stderr: string;
  /** The exception the cell raised (a timeout's interruption too); null if none. Not thrown: a cell that raises still ran. */
  readonly error: CodeError | null;
  /** The context's cell counter (IPython's In [n]). */
  readonly execution_count: number | null;
  /** It ran past its timeout and was interrupted. */
  readonly timed_out: boolean;
  readonly duration_ms: number;
  /** The seed it ran with, or null (none given). */
  readonly seed: string | null;

  constructor(r: CodeResult) {
    this.context = r.context;
    this.results = r.results;
    this.stdout = r.stdout;
    this.stderr = r.stderr;
    this.error = r.error;
    this.execution_count = r.execution_count;
    this.timed_out = r.timed_out;
    this.duration_ms = r.duration_ms;
    this.seed = r.seed;
  }

  /** The main result's `text/plain` (the last expression's value as the REPL shows it); undefined when the cell has none. */
  get text(): string | undefined {
    const t = this.results.find((r) => r.is_main_result)?.data['text/plain'];
    return typeof t === 'string' ? t : undefined;
  }
}

/** @internal A context argument: its id, or the context as the API returned it. */
export function codeContextId(context: string | CodeContext): string {
  return typeof context === 'string' ? context : context.id;
}
