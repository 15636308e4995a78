/**
 * Usage: the tier, its limits and concurrency against the cap (GET /v1/limits); metered seconds per
 * day for the last 14 days (one GET /v1/usage?per=day) and per template this month, as charts.
 */
import uPlot from 'uplot';
import { api } from '../api.js';
import { errorBox, fill, h } from '../dom.js';
import type { Page } from '../app.js';

interface Totals { running_secs: number; vcpu_secs: number; memory_mib_secs: number; suspended_secs: number; snapshot_mib_secs: number }
interface Usage { from: string; to: string; totals: Totals; sandboxes: Array<Totals & { id: string; template: string }>; days?: Array<{ from: string; totals: Totals }> }
interface Limits { tier: string; max_running: number | null; running: number; own_images: boolean; max_session_secs: number; max_vcpus: number; max_memory_mib: number }

const DAYS = 14;
const DAY_MS = 86_400_000;

export const usagePage: Page = (main) => {
  const err = errorBox();
  const limits = h('dl', { class: 'details', id: 'limits' });
  const perDay = h('div', { class: 'chart', id: 'chart-days', role: 'img', 'aria-label': 'Running and snapshot seconds per day' });
  const perTemplate = h('tbody', { id: 'per-template' });
  const perTemplateChart = h('div', { class: 'chart', id: 'chart-templates', role: 'img', 'aria-label': 'Running seconds per template this month' });
  const charts: uPlot[] = [];

  fill(main,
    h('h1', {}, 'Usage'),
    err.el,
    h('h2', {}, 'Tier and limits'), limits,
    h('h2', {}, `Per day, last ${DAYS} days`), perDay,
    h('h2', {}, 'Per template, this month'),
    perTemplateChart,
    h('table', { class: 'list' }, h('thead', {}, h('tr', {}, ...['Template', 'Sandboxes', 'Running s', 'vCPU s', 'Snapshot MiB·s'].map((c) => h('th', { scope: 'col' }, c)))), perTemplate),
  );

  void (async () => {
    try {
      const l = await api<Limits>('GET', '/v1/limits');
      const cap = l.max_running === null ? 'no cap' : String(l.max_running);
      fill(limits, ...([
        ['Tier', l.tier], ['Running now', `${l.running} of ${cap}`], ['Own images', l.own_images ? 'yes' : 'no'],
        ['Longest session', `${l.max_session_secs} s`], ['Largest VM', `${l.max_vcpus} vCPU · ${l.max_memory_mib} MiB`],
      ] as const).flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));

      const today = new Date();
      const midnight = Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate());
      const first = midnight - (DAYS - 1) * DAY_MS;
      const report = await api<Usage>('GET', `/v1/usage?per=day&from=${new Date(first).toISOString()}&to=${new Date(midnight + DAY_MS).toISOString()}`);
      const days = report.days ?? [];
      const chart = new uPlot({
        width: Math.min(900, main.clientWidth || 900),
        height: 260,
        series: [
          {},
          { label: 'Running s', stroke: '#2563eb', fill: 'rgba(37,99,235,0.15)' },
          { label: 'Snapshot MiB·s / 1000', stroke: '#d97706' },
        ],
        axes: [{}, { size: 70 }],
      }, [days.map((d) => Date.parse(d.from) / 1000), days.map((d) => d.totals.running_secs), days.map((d) => d.totals.snapshot_mib_secs / 1000)], perDay);
      charts.push(chart);

      const month = await api<Usage>('GET', '/v1/usage');
      const byTemplate = new Map<string, { n: number; running: number; vcpu: number; snap: number }>();
      for (const s of month.sandboxes) {
        const t = byTemplate.get(s.template) ?? { n: 0, running: 0, vcpu: 0, snap: 0 };
        byTemplate.set(s.template, { n: t.n + 1, running: t.running + s.running_secs, vcpu: t.vcpu + s.vcpu_secs, snap: t.snap + s.snapshot_mib_secs });
      }
      const names = [...byTemplate.keys()];
      if (names.length) {
        charts.push(new uPlot({
          width: Math.min(900, main.clientWidth || 900),
          height: 220,
          scales: { x: { time: false, range: [-0.5, names.length - 0.5] } },
          series: [{}, { label: 'Running s', stroke: '#2563eb', fill: 'rgba(37,99,235,0.35)', paths: uPlot.paths.bars!({ size: [0.6, 80] }), points: { show: false } }],
          axes: [{ values: (_u, splits) => splits.map((i) => names[i] ?? ''), splits: () => names.map((_, i) => i) }, { size: 70 }],
        }, [names.map((_, i) => i), names.map((n) => byTemplate.get(n)!.running)], perTemplateChart));
      }
      fill(perTemplate, ...[...byTemplate].map(([t, v]) => h('tr', {}, h('td', {}, t), h('td', {}, v.n), h('td', {}, Math.round(v.running)), h('td', {}, Math.round(v.vcpu)), h('td', {}, Math.round(v.snap)))));
    } catch (e) {
      err.show(e);
    }
  })();
  return () => charts.forEach((c) => c.destroy());
};
