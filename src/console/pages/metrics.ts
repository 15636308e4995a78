/**
 * A sandbox's Metrics section: its CPU, memory and disk use over its life (GET /v1/sandboxes/{id}/metrics,
 * which the server samples every period_secs while the sandbox runs, reading the disk in the guest every
 * disk_period_secs) as inline SVG charts, and a table of the latest and peak values that also reads well
 * to a screen reader. While the sandbox runs the section
 * asks, each period, only for the samples newer than those it holds; suspended, it shows the history
 * and asks no more; once the sandbox is gone, or the page is left, it stops.
 */
import { api, type Sandbox, type SandboxMetrics } from '../api.js';
import { bytes, duration, errorBox, fill, h, svg } from '../dom.js';
import { lineChart, type ChartSpec, type Point } from '../lineChart.js';

interface Sample { atMs: number; cpuPercent: number | null; memoryMib: number; diskUsedBytes: number | null; diskTotalBytes: number | null }

export interface MetricsSection {
  el: HTMLElement;
  /** The sandbox as the page last read it, or null once it is gone. */
  show(sandbox: Sandbox | null): void;
  /** The page is left: no more requests. */
  close(): void;
}

const SIZE = { width: 560, height: 200, pad: { top: 16, right: 12, bottom: 24, left: 44 } };
/** A young series fills its first minute from the left rather than stretching over the whole width. */
const MIN_SPAN_MS = 60_000;

export function metricsSection(sandboxId: string): MetricsSection {
  const ferr = errorBox();
  const body = h('div', { id: 'metrics-body', 'data-samples': 0 });
  const el = h('div', { id: 'metrics' }, ferr.el, body);
  const samples: Sample[] = [];
  let periodMs = 5000;
  let diskPeriodMs = 30_000;
  let sandbox: Sandbox | null = null;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let closed = false;

  const running = () => !closed && sandbox?.state === 'running';

  async function refresh(): Promise<void> {
    clearTimeout(timer);
    if (closed || !sandbox) return;
    try {
      const since = samples.at(-1)?.atMs;
      const query = since === undefined ? '' : `?from=${encodeURIComponent(new Date(since + 1).toISOString())}`;
      const r = await api<SandboxMetrics>('GET', `/v1/sandboxes/${sandboxId}/metrics${query}`);
      if (closed) return;
      periodMs = r.period_secs * 1000;
      diskPeriodMs = r.disk_period_secs * 1000;
      // Two refreshes may overlap (a state change while one waits): keep each sample once.
      for (const s of r.samples) {
        const atMs = Date.parse(s.at);
        if (atMs > (samples.at(-1)?.atMs ?? -Infinity)) {
          samples.push({ atMs, cpuPercent: s.cpu_percent, memoryMib: s.memory_mib, diskUsedBytes: s.disk_used_bytes, diskTotalBytes: s.disk_total_bytes });
        }
      }
      ferr.clear();
    } catch (e) {
      if ((e as { code?: string }).code === 'sandbox_not_found') sandbox = null;
      else ferr.show(e);
    }
    if (closed) return;
    draw();
    clearTimeout(timer);
    if (running()) timer = setTimeout(() => void refresh(), periodMs);
  }

  function draw(): void {
    const s = sandbox;
    body.dataset.samples = String(samples.length);
    if (!s) return fill(body, h('p', { class: 'muted' }, '—'));
    if (!samples.length) {
      return fill(body, h('p', { class: 'muted', id: 'metrics-empty', role: 'status' },
        s.state === 'running'
          ? `No samples yet: one is taken every ${duration(periodMs / 1000)} while it runs.`
          : 'No samples: they are taken while it runs (and start anew when the server restarts).'));
    }
    const first = samples[0].atMs;
    const last = samples[samples.length - 1];
    const over = `over ${duration((last.atMs - first) / 1000)}, ${samples.length} sample${samples.length === 1 ? '' : 's'}`;
    const cpu = samples.map((x): Point => ({ atMs: x.atMs, value: x.cpuPercent }));
    const memory = samples.map((x): Point => ({ atMs: x.atMs, value: x.memoryMib }));
    const cpuPeak = peak(cpu);
    const memoryPeak = peak(memory);
    const cpuNow = last.cpuPercent === null ? '—' : percent(last.cpuPercent);
    const mib = (n: number) => bytes(n * 1048576);
    // Disk in MiB like memory; the size is the root file system's as df says it (a little under the disk's, for ext4's own use).
    const disk = samples.map((x): Point => ({ atMs: x.atMs, value: x.diskUsedBytes === null ? null : Math.round((x.diskUsedBytes / 1048576) * 10) / 10 }));
    const diskPeak = peak(disk);
    const diskSizeMib = (samples.findLast((x) => x.diskTotalBytes !== null)?.diskTotalBytes ?? s.disk_mib * 1048576) / 1048576;
    const diskNow = last.diskUsedBytes === null ? '—' : bytes(last.diskUsedBytes);
    const diskRead = disk.some((p) => p.value !== null);
    fill(body,
      s.state === 'running' ? null : h('p', { class: 'muted', id: 'metrics-paused' }, `${s.state[0].toUpperCase()}${s.state.slice(1)}: no samples are taken until it runs again; its history so far:`),
      h('div', { class: 'columns charts' },
        chart({
          id: 'chart-cpu',
          title: `CPU, % (100 % = one vCPU busy; ${s.vcpus} vCPU)`,
          summary: `CPU ${over}: latest ${cpuNow}, peak ${cpuPeak === null ? '—' : percent(cpuPeak)}; ${s.vcpus} vCPU make ${s.vcpus * 100} %.`,
          points: cpu,
          reference: s.vcpus * 100,
          referenceLabel: `${s.vcpus} vCPU`,
          periodMs,
        }),
        chart({
          id: 'chart-memory',
          title: `Memory, MiB (the VMM's resident set, of ${mib(s.memory_mib)} allotted)`,
          summary: `Memory ${over}: latest ${mib(last.memoryMib)}, peak ${mib(memoryPeak ?? 0)}, of ${mib(s.memory_mib)} allotted.`,
          points: memory,
          reference: s.memory_mib,
          referenceLabel: `${mib(s.memory_mib)} allotted`,
          periodMs,
        }),
        chart({
          id: 'chart-disk',
          title: `Disk, MiB (used on / as df says it, read every ${duration(diskPeriodMs / 1000)}; of ${mib(diskSizeMib)})`,
          summary: diskRead
            ? `Disk ${over}: latest ${diskNow}, peak ${mib(diskPeak ?? 0)} used, of ${mib(diskSizeMib)}.`
            : `Disk ${over}: not read yet, or its guest cannot tell (a sandbox from before disk use was read); ${mib(diskSizeMib)} in all.`,
          points: disk,
          reference: diskSizeMib,
          referenceLabel: `${mib(diskSizeMib)} size`,
          periodMs,
        }),
      ),
      h('table', { class: 'list metrics', id: 'metrics-latest' },
        h('caption', {}, `Latest at ${new Date(last.atMs).toLocaleTimeString()}, ${over}`),
        h('thead', {}, h('tr', {}, ...['', 'Latest', 'Peak', 'Allotted'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {},
          h('tr', { 'data-metric': 'cpu' }, h('th', { scope: 'row' }, 'CPU'), h('td', {}, cpuNow), h('td', {}, cpuPeak === null ? '—' : percent(cpuPeak)), h('td', {}, `${s.vcpus} vCPU (${s.vcpus * 100} %)`)),
          h('tr', { 'data-metric': 'memory' }, h('th', { scope: 'row' }, 'Memory'), h('td', {}, mib(last.memoryMib)), h('td', {}, mib(memoryPeak ?? 0)), h('td', {}, mib(s.memory_mib))),
          h('tr', { 'data-metric': 'disk' }, h('th', { scope: 'row' }, 'Disk'), h('td', {}, diskNow), h('td', {}, diskPeak === null ? '—' : mib(diskPeak)), h('td', {}, mib(diskSizeMib))),
        ),
      ),
    );
  }

  return {
    el,
    show(next) {
      if (closed) return;
      const changed = next?.state !== sandbox?.state || next === null;
      sandbox = next;
      if (!next) {
        clearTimeout(timer);
        return draw();
      }
      // The page reads the sandbox on every change of the tenant's: ask again only when this one's state changed.
      if (changed) void refresh();
    },
    close() {
      closed = true;
      clearTimeout(timer);
    },
  };
}

function chart(o: { id: string; title: string; summary: string; points: Point[]; reference: number; referenceLabel: string; periodMs: number }): HTMLElement {
  const spec: ChartSpec = { ...SIZE, periodMs: o.periodMs, minSpanMs: MIN_SPAN_MS, reference: o.reference, utcOffsetMs: -new Date().getTimezoneOffset() * 60_000 };
  const m = lineChart(o.points, spec);
  const { left, top, right, bottom } = m.plot;
  const clock: Intl.DateTimeFormatOptions = m.time.stepMs < 60_000 ? { hour: '2-digit', minute: '2-digit', second: '2-digit' } : { hour: '2-digit', minute: '2-digit' };
  return h('figure', { class: 'metric' },
    h('figcaption', {}, o.title),
    svg('svg', { id: o.id, class: 'chart-svg', viewBox: `0 0 ${spec.width} ${spec.height}`, role: 'img', 'aria-label': o.summary },
      ...m.value.ticks.map((t) => svg('g', { class: 'tick' },
        svg('line', { class: 'grid', x1: left, x2: right, y1: t.y, y2: t.y }),
        svg('text', { class: 'y-label', x: left - 6, y: t.y }, t.value))),
      ...m.time.ticks.map((t) => svg('g', { class: 'tick' },
        svg('line', { class: 'grid', x1: t.x, x2: t.x, y1: top, y2: bottom }),
        svg('text', { class: 'x-label', x: t.x, y: bottom + 16 }, new Date(t.atMs).toLocaleTimeString([], clock)))),
      svg('line', { class: 'axis', x1: left, x2: right, y1: bottom, y2: bottom }),
      svg('line', { class: 'reference', x1: left, x2: right, y1: m.referenceY, y2: m.referenceY }),
      svg('text', { class: 'reference-label', x: right, y: m.referenceY - 4 }, o.referenceLabel),
      svg('path', { class: 'series', d: m.line }),
      ...m.dots.map((d) => svg('circle', { class: 'series-dot', cx: d.x, cy: d.y, r: 2.5 })),
    ),
  );
}

/** The largest measured value, or null when none was. */
function peak(points: Point[]): number | null {
  return points.reduce<number | null>((m, p) => (p.value === null ? m : Math.max(m ?? p.value, p.value)), null);
}

function percent(n: number): string {
  return `${Math.round(n * 10) / 10} %`;
}
