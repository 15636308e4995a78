import type { PhaseReport } from '../src/sandboxes/phases.ts';
/** Small statistics helpers for the benchmarks: medians and tail percentiles over many runs. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const idx = Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1));
  return s[idx];
}

export function summary(values: number[]): { n: number; p50: number; p99: number; min: number; max: number } {
  return { n: values.length, p50: percentile(values, 50), p99: percentile(values, 99), min: Math.min(...values), max: Math.max(...values) };
}

export function fmt(ms: number): string {
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2);
}

export async function timed<T>(fn: () => Promise<T>): Promise<[number, T]> {
  const t0 = performance.now();
  const r = await fn();
  return [performance.now() - t0, r];
}

export function pssMiB(pid: number, readFile: (p: string) => string): number {
  const m = readFile(`/proc/${pid}/smaps_rollup`).match(/^Pss:\s+(\d+)/m);
  return m ? Number(m[1]) / 1024 : NaN;
}

export function rssMiB(pid: number, readFile: (p: string) => string): number {
  const m = readFile(`/proc/${pid}/smaps_rollup`).match(/^Rss:\s+(\d+)/m);
  return m ? Number(m[1]) / 1024 : NaN;
}

/**
 * The phases of the operations a bench filed by what it measured (src/sandboxes/phases.ts), as a
 * markdown table: p50 and p99 of each phase and of the total, then the CPU time summed over each
 * operation ("CPU:" rows: what bounds a wide fork on few cores).
 */
export function phaseTable(reports: Map<string, PhaseReport[]>): string[] {
  const out = ['| operation | phase | n | p50 | p99 |', '|---|---|---|---|---|'];
  for (const [what, list] of reports) {
    const names = [...new Set(list.flatMap((r) => Object.keys(r.phases)))];
    for (const name of [...names, 'total']) {
      const v = summary(list.map((r) => (name === 'total' ? r.totalMs : r.phases[name])).filter((x): x is number => x !== undefined));
      out.push(`| ${what} | ${name} | ${v.n} | ${fmt(v.p50)} | ${fmt(v.p99)} |`);
    }
    for (const name of new Set(list.flatMap((r) => Object.keys(r.cpuMs ?? {})))) {
      const v = summary(list.map((r) => r.cpuMs?.[name]).filter((x): x is number => x !== undefined));
      out.push(`| ${what} | CPU: ${name} | ${v.n} | ${fmt(v.p50)} | ${fmt(v.p99)} |`);
    }
  }
  return out;
}
