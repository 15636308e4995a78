/**
 * The console's line chart geometry (src/console/lineChart.ts), which the sandbox page's Metrics
 * section draws as SVG: pixel scaling of time and value, the value axis growing past its reference,
 * breaks at missing values and long gaps, a lone sample as a dot, empty input, and time ticks on
 * whole steps of local time. Literal expectations, worked out by hand.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
// A static import keeps the module inside the root type-check, which has no DOM: it must stay pure.
import { lineChart, niceStep, type ChartSpec } from '../../../src/console/lineChart.ts';

/** A 100 × 60 box with a plot from (10, 10) to (90, 50): 80 px of time, 40 px of value. */
const SPEC: ChartSpec = { width: 100, height: 60, pad: { top: 10, right: 10, bottom: 10, left: 10 }, periodMs: 5000, minSpanMs: 20_000, reference: 100 };
const HOUR = 3_600_000;

test('points are scaled into the plot: time left to right, value bottom to top', () => {
  const m = lineChart([{ atMs: 0, value: 0 }, { atMs: 5000, value: 50 }, { atMs: 10_000, value: 100 }, { atMs: 20_000, value: 25 }], SPEC);
  assert.deepEqual(m.plot, { left: 10, top: 10, right: 90, bottom: 50 });
  assert.equal(m.line, 'M10,50L30,30L50,10L90,40');
  assert.deepEqual(m.dots, []);
  assert.deepEqual(m.value, { max: 100, ticks: [{ value: 0, y: 50 }, { value: 25, y: 40 }, { value: 50, y: 30 }, { value: 75, y: 20 }, { value: 100, y: 10 }] });
  assert.equal(m.referenceY, 10);
  assert.deepEqual(m.time, { from: 0, to: 20_000, stepMs: 5000, ticks: [0, 5000, 10_000, 15_000, 20_000].map((atMs, i) => ({ atMs, x: 10 + 20 * i })) });
});

test('a value above the reference raises the value axis to a round number; the reference line moves down', () => {
  const m = lineChart([{ atMs: 0, value: 130 }, { atMs: 10_000, value: 0 }], SPEC);
  assert.equal(m.value.max, 150);
  assert.deepEqual(m.value.ticks.map((t) => t.value), [0, 50, 100, 150]);
  assert.equal(m.referenceY, 23.3);
  assert.equal(m.line, 'M10,15.3L50,50');
});

test('a missing value and a gap longer than three periods break the line; a point left alone is a dot', () => {
  const spec = { ...SPEC, minSpanMs: 0 };
  const m = lineChart([
    { atMs: 0, value: 10 },
    { atMs: 5000, value: null }, // a first sample after a restart has no CPU figure
    { atMs: 10_000, value: 20 },
    { atMs: 15_000, value: 30 },
    { atMs: 40_000, value: 40 }, // 25 s later: it was suspended
  ], spec);
  assert.equal(m.line, 'M30,42L40,38');
  assert.deepEqual(m.dots, [{ x: 10, y: 46 }, { x: 90, y: 34 }]);
  // Three periods apart still join.
  assert.equal(lineChart([{ atMs: 0, value: 0 }, { atMs: 15_000, value: 0 }], spec).line, 'M10,50L90,50');
});

test('a single sample is a dot at the left of a time axis of the minimum span', () => {
  const m = lineChart([{ atMs: 1000, value: 50 }], SPEC);
  assert.equal(m.line, '');
  assert.deepEqual(m.dots, [{ x: 10, y: 30 }]);
  assert.equal(m.time.from, 1000);
  assert.equal(m.time.to, 21_000);
  // Without a minimum span there is still an axis (no division by zero).
  assert.deepEqual(lineChart([{ atMs: 1000, value: 50 }], { ...SPEC, minSpanMs: 0 }).dots, [{ x: 10, y: 30 }]);
});

test('no samples: nothing drawn, the axes still stand on the reference', () => {
  const m = lineChart([], SPEC);
  assert.equal(m.line, '');
  assert.deepEqual(m.dots, []);
  assert.equal(m.value.max, 100);
  assert.equal(m.referenceY, 10);
  // A sample with no value draws nothing either.
  assert.equal(lineChart([{ atMs: 0, value: null }], SPEC).dots.length, 0);
});

test('time ticks fall on whole steps of the viewer\'s local time', () => {
  const spec = { ...SPEC, minSpanMs: 5 * HOUR };
  const utc = lineChart([{ atMs: 0, value: 1 }], spec);
  assert.equal(utc.time.stepMs, HOUR);
  assert.deepEqual(utc.time.ticks.map((t) => t.atMs / HOUR), [0, 1, 2, 3, 4, 5]);
  const india = lineChart([{ atMs: 0, value: 1 }], { ...spec, utcOffsetMs: 5.5 * HOUR });
  assert.deepEqual(india.time.ticks.map((t) => t.atMs / HOUR), [0.5, 1.5, 2.5, 3.5, 4.5]);
  // Twelve hours of samples, the most the server keeps: a tick every 2 hours.
  assert.equal(lineChart([{ atMs: 0, value: 1 }, { atMs: 12 * HOUR, value: 1 }], SPEC).time.stepMs, 2 * HOUR);
});

test('value steps are 1, 2, 2.5 or 5 × 10ⁿ, at most four to the top', () => {
  assert.deepEqual([100, 130, 200, 512, 1, 0.3, 0, -5].map((max) => niceStep(max, 4)), [25, 50, 50, 200, 0.25, 0.1, 1, 1]);
});
