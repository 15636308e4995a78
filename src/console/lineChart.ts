/**
 * The geometry of a line chart over time: pixel positions, axis ticks and SVG path data as plain
 * numbers and strings. No DOM, so it is tested without a browser (test/unit/console/lineChart.test.ts);
 * pages/metrics.ts draws it as inline SVG.
 */

/** One sample: when (unix ms) and its value; null where nothing was measured (a break in the line). */
export interface Point {
  atMs: number;
  value: number | null;
}

export interface ChartSpec {
  /** The SVG's viewBox size; the plot sits inside it, `pad` in from each edge (room for the labels). */
  width: number;
  height: number;
  pad: { top: number; right: number; bottom: number; left: number };
  /** How often points come: two more than GAP_PERIODS periods apart are not joined (a suspension, a server restart). */
  periodMs: number;
  /** The time axis spans at least this from the first point, so a young series fills it from the left. */
  minSpanMs: number;
  /** A level drawn across the plot (all vCPUs busy, the memory allotted); the value axis reaches at least it. */
  reference: number;
  /** Time ticks fall on whole steps of local time: the viewer's offset from UTC (minutes east × 60 000). */
  utcOffsetMs?: number;
}

export interface ChartModel {
  plot: { left: number; top: number; right: number; bottom: number };
  time: { from: number; to: number; stepMs: number; ticks: Array<{ atMs: number; x: number }> };
  value: { max: number; ticks: Array<{ value: number; y: number }> };
  referenceY: number;
  /** SVG path data of the runs of joined points; '' when no two neighbours join. */
  line: string;
  /** Points joined to neither neighbour (a lone sample, one between gaps): drawn as dots, since a path of one point shows nothing. */
  dots: Array<{ x: number; y: number }>;
}

export const GAP_PERIODS = 3;
const VALUE_INTERVALS = 4;
const TIME_TICKS = 6;
const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
const TIME_STEPS = [SECOND, 2 * SECOND, 5 * SECOND, 10 * SECOND, 15 * SECOND, 30 * SECOND, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE,
  15 * MINUTE, 30 * MINUTE, HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, 24 * HOUR];

/** `points` oldest first. */
export function lineChart(points: readonly Point[], spec: ChartSpec): ChartModel {
  const plot = { left: spec.pad.left, top: spec.pad.top, right: spec.width - spec.pad.right, bottom: spec.height - spec.pad.bottom };
  const from = points.length ? points[0].atMs : 0;
  const to = from + Math.max(spec.minSpanMs, points.length ? points[points.length - 1].atMs - from : 0, 1);
  const peak = points.reduce((m, p) => Math.max(m, p.value ?? 0), spec.reference);
  const step = niceStep(peak, VALUE_INTERVALS);
  const max = round(Math.ceil(peak / step - 1e-9) * step);
  const x = (t: number) => px(plot.left + ((t - from) / (to - from)) * (plot.right - plot.left));
  const y = (v: number) => px(plot.bottom - (v / max) * (plot.bottom - plot.top));

  const stepMs = TIME_STEPS.find((s) => (to - from) / s <= TIME_TICKS) ?? TIME_STEPS[TIME_STEPS.length - 1];
  const offset = spec.utcOffsetMs ?? 0;
  const timeTicks: Array<{ atMs: number; x: number }> = [];
  for (let t = Math.ceil((from + offset) / stepMs) * stepMs - offset; t <= to; t += stepMs) timeTicks.push({ atMs: t, x: x(t) });

  const valueTicks: Array<{ value: number; y: number }> = [];
  for (let i = 0; round(i * step) <= max; i++) valueTicks.push({ value: round(i * step), y: y(round(i * step)) });

  // Runs of neighbours that join: both measured and close enough in time.
  const runs: Point[][] = [];
  let run: Point[] = [];
  for (const p of points) {
    const prev = run[run.length - 1];
    if (p.value === null || (prev && p.atMs - prev.atMs > GAP_PERIODS * spec.periodMs)) {
      if (run.length) runs.push(run);
      run = [];
    }
    if (p.value !== null) run.push(p);
  }
  if (run.length) runs.push(run);
  const line = runs
    .filter((r) => r.length > 1)
    .map((r) => r.map((p, i) => `${i ? 'L' : 'M'}${x(p.atMs)},${y(p.value!)}`).join(''))
    .join('');
  const dots = runs.filter((r) => r.length === 1).map(([p]) => ({ x: x(p.atMs), y: y(p.value!) }));

  return {
    plot,
    time: { from, to, stepMs, ticks: timeTicks },
    value: { max, ticks: valueTicks },
    referenceY: y(spec.reference),
    line,
    dots,
  };
}

/** The step of 1, 2, 2.5 or 5 × 10ⁿ that divides 0..`max` into at most `intervals` (a positive max; 1 otherwise). */
export function niceStep(max: number, intervals: number): number {
  if (!(max > 0)) return 1;
  const raw = max / intervals;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  return round([1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw - 1e-9)!);
}

/** Pixels to a tenth: enough for a crisp line, short path strings. */
function px(n: number): number {
  return Math.round(n * 10) / 10;
}

/** Drops binary floating-point noise (0.30000000000000004 → 0.3). */
function round(n: number): number {
  return Number(n.toPrecision(12));
}
