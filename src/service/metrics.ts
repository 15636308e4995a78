/**
 * A small Prometheus text-format (0.0.4) implementation: counters, gauges (optionally computed at
 * scrape time) and histograms with labels. Enough for /metrics without a dependency.
 */
type Labels = Record<string, string>;

const escapeLabel = (v: string) => v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');

function labelText(labels: Labels, extra?: [string, string]): string {
  const parts = Object.keys(labels)
    .sort()
    .map((k) => `${k}="${escapeLabel(labels[k])}"`);
  if (extra) parts.push(`${extra[0]}="${escapeLabel(extra[1])}"`);
  return parts.length ? `{${parts.join(',')}}` : '';
}

const keyOf = (labels: Labels) => JSON.stringify(Object.keys(labels).sort().map((k) => [k, labels[k]]));

function fmt(n: number): string {
  if (Number.isNaN(n)) return 'NaN';
  if (n === Infinity) return '+Inf';
  if (n === -Infinity) return '-Inf';
  return String(n);
}

/** What a scrape may see: `names` — tenants' environments by name (the operator's authenticated scrape). */
export interface RenderOptions {
  names: boolean;
}

interface Metric {
  render(o: RenderOptions): string;
}

export class Counter implements Metric {
  private readonly values = new Map<string, { labels: Labels; value: number }>();
  constructor(readonly name: string, readonly help: string) {}
  inc(labels: Labels = {}, by = 1): void {
    const k = keyOf(labels);
    const v = this.values.get(k);
    if (v) v.value += by;
    else this.values.set(k, { labels, value: by });
  }
  render(): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} counter\n`;
    for (const { labels, value } of this.values.values()) out += `${this.name}${labelText(labels)} ${fmt(value)}\n`;
    return out;
  }
}

export class Gauge implements Metric {
  private readonly values = new Map<string, { labels: Labels; value: number }>();
  /** `collect`, when given, replaces the stored values at every scrape. */
  constructor(readonly name: string, readonly help: string, private readonly collect?: (o: RenderOptions) => Array<{ labels: Labels; value: number }>) {}
  set(labels: Labels, value: number): void {
    this.values.set(keyOf(labels), { labels, value });
  }
  render(o: RenderOptions): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} gauge\n`;
    const values = this.collect ? this.collect(o) : [...this.values.values()];
    for (const { labels, value } of values) out += `${this.name}${labelText(labels)} ${fmt(value)}\n`;
    return out;
  }
}

export const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export class Histogram implements Metric {
  private readonly series = new Map<string, { labels: Labels; counts: number[]; sum: number; count: number }>();
  constructor(readonly name: string, readonly help: string, readonly buckets: number[] = LATENCY_BUCKETS) {}
  observe(value: number, labels: Labels = {}): void {
    const k = keyOf(labels);
    let s = this.series.get(k);
    if (!s) this.series.set(k, (s = { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 }));
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]) s.counts[i]++;
    s.sum += value;
    s.count++;
  }
  /** Starts a timer; call the result to observe the elapsed seconds. */
  startTimer(labels: Labels = {}): () => number {
    const t0 = process.hrtime.bigint();
    return () => {
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      this.observe(secs, labels);
      return secs;
    };
  }
  render(): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} histogram\n`;
    for (const s of this.series.values()) {
      this.buckets.forEach((b, i) => (out += `${this.name}_bucket${labelText(s.labels, ['le', fmt(b)])} ${s.counts[i]}\n`));
      out += `${this.name}_bucket${labelText(s.labels, ['le', '+Inf'])} ${s.count}\n`;
      out += `${this.name}_sum${labelText(s.labels)} ${fmt(s.sum)}\n`;
      out += `${this.name}_count${labelText(s.labels)} ${s.count}\n`;
    }
    return out;
  }
}

export class MetricsRegistry {
  private readonly metrics: Metric[] = [];
  register<T extends Metric>(m: T): T {
    this.metrics.push(m);
    return m;
  }
  /** The text format; without `names`, nothing in it names a tenant or an environment. */
  render(o: RenderOptions = { names: false }): string {
    return this.metrics.map((m) => m.render(o)).join('');
  }
}
