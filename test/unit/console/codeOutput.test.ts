/**
 * The Code panel's render pieces (src/console/codeOutput.ts): a cell's result, or its stream folded
 * event by event, becomes text, data-URL images and sandboxed-iframe HTML — each output in its
 * richest form, and nothing from the sandbox ever in a form that the console's document would run.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
// A static import keeps the module inside the root type-check, which has no DOM: it must stay pure.
import { applyCodeEvent, cellPieces, emptyCell, type CellState } from '../../../src/console/codeOutput.ts';

const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==';

const plotted: CellState = {
  stdout: 'hi\n',
  stderr: 'careful\n',
  results: [
    { is_main_result: false, data: { 'text/plain': '<Figure size 640x480 with 1 Axes>', 'image/png': PNG } },
    { is_main_result: true, data: { 'text/plain': '2' } },
  ],
  error: null,
  execution_count: 7,
  timed_out: false,
};

test('a result: stdout, stderr, then each output (an image as a data URL, a value as text), in order', () => {
  assert.deepEqual(cellPieces(plotted), [
    { kind: 'stdout', text: 'hi\n' },
    { kind: 'stderr', text: 'careful\n' },
    { kind: 'image', src: `data:image/png;base64,${PNG}`, alt: '<Figure size 640x480 with 1 Axes>', main: false },
    { kind: 'text', text: '2', main: true },
  ]);
});

test('each output in its richest form: PNG over SVG over HTML over text; SVG is an image, never markup', () => {
  const svg = '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>';
  const pieces = cellPieces({
    ...emptyCell(),
    results: [
      { is_main_result: true, data: { 'text/plain': 'df', 'text/html': '<table><tr><td>1</td></tr></table>' } },
      { is_main_result: false, data: { 'text/plain': 'svg', 'image/svg+xml': svg, 'text/html': '<b>x</b>' } },
      { is_main_result: false, data: { 'e2b/chart': { type: 'line' } } },
      { is_main_result: false, data: {} },
    ],
  });
  assert.deepEqual(pieces, [
    { kind: 'html', html: '<table><tr><td>1</td></tr></table>', main: true },
    { kind: 'image', src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`, alt: 'svg', main: false },
    { kind: 'note', text: '(an output of type e2b/chart, not shown here)' },
  ]);
});

test('an image/png that is not base64 is not put into a URL: the text shows instead', () => {
  const pieces = cellPieces({ ...emptyCell(), results: [{ is_main_result: true, data: { 'text/plain': 'fake', 'image/png': 'x" onerror="alert(1)' } }] });
  assert.deepEqual(pieces, [{ kind: 'text', text: 'fake', main: true }]);
});

test('an exception and a timeout close the pieces', () => {
  const error = { name: 'KeyboardInterrupt', value: '', traceback: 'KeyboardInterrupt\n' };
  assert.deepEqual(cellPieces({ ...emptyCell(), error, timed_out: true }), [
    { kind: 'error', ...error },
    { kind: 'note', text: 'The cell ran past its timeout and was interrupted.' },
  ]);
});

test('stream events fold into what the result then says, and the result replaces them', () => {
  let cell = emptyCell();
  for (const [event, data] of [
    ['stdout', { text: 'h' }],
    ['stdout', { text: 'i\n' }],
    ['stderr', { text: 'careful\n' }],
    ['display', plotted.results[0]],
    ['display', plotted.results[1]],
    ['ping', {}],
  ] as const) cell = applyCodeEvent(cell, event, data);
  assert.deepEqual(cellPieces(cell), cellPieces(plotted));
  assert.equal(cell.execution_count, null, 'the count comes with the result');
  const error = { name: 'ZeroDivisionError', value: 'division by zero', traceback: 'Traceback…' };
  assert.deepEqual(applyCodeEvent(cell, 'exception', error).error, error);
  assert.equal(applyCodeEvent(cell, 'result', plotted), plotted);
});
