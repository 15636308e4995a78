// Collimate's JavaScript kernel (docs/code.md), started by server.py: one per context, on the
// image's Node.js. Commands arrive as JSON lines on stdin ({op: "execute", id, code, seed?} or
// {op: "env", env}); events leave as JSON lines on the descriptor COLLIMATE_KERNEL_FD, so the cell's
// own console output (captured into stdout/stderr events) never mixes with them.
//
// A cell is a script run in one context that lives as long as the kernel: its top-level `var`,
// `let`, `const`, functions and classes stay for the next cell, and the value of its last
// expression is the result. A cell that uses top-level `await` runs as the body of an async
// function (its declarations are then its own; assign to globalThis to keep one). A returned
// promise is awaited. SIGINT (the server's interrupt) stops a synchronous loop.
'use strict';
const fs = require('node:fs');
const util = require('node:util');
const vm = require('node:vm');
const readline = require('node:readline');
const { createRequire } = require('node:module');
const path = require('node:path');

const out = Number(process.env.COLLIMATE_KERNEL_FD);
delete process.env.COLLIMATE_KERNEL_FD;
const emit = (ev) => fs.writeSync(out, JSON.stringify(ev) + '\n');

let cell = null; // the id of the cell running now: output goes to it
let count = 0;

// Output of the process (console.*, process.stdout.write) is the running cell's.
for (const [name, stream] of [['stdout', process.stdout], ['stderr', process.stderr]]) {
  stream.write = (chunk, encoding, cb) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(typeof encoding === 'string' ? encoding : 'utf8');
    if (cell) emit({ id: cell, type: name, text });
    const done = typeof encoding === 'function' ? encoding : cb;
    if (done) process.nextTick(done);
    return true;
  };
}

// Math.random from a seed for a seeded cell (xoshiro128**, seeded by splitmix32 over the seed's halves).
function seededRandom(seed) {
  let big = BigInt(seed);
  let x = Number(big & 0xffffffffn) >>> 0;
  const s = [];
  const next = () => {
    x = (x + 0x9e3779b9) >>> 0;
    let z = x;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
  s.push(next(), next());
  x = (x ^ Number((big >> 32n) & 0xffffffffn)) >>> 0;
  s.push(next(), next());
  return () => {
    const r = Math.imul(((Math.imul(s[1], 5) << 7) | (Math.imul(s[1], 5) >>> 25)), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = (s[3] << 11) | (s[3] >>> 21);
    return r / 4294967296;
  };
}

const context = vm.createContext(Object.assign(Object.create(null), {
  // require resolves from the context's directory, as a script saved there would.
  require: createRequire(path.join(process.cwd(), '<cell>')), module, exports: {}, __filename: '<cell>', __dirname: process.cwd(), process, console, Buffer, URL, URLSearchParams,
  TextEncoder, TextDecoder, AbortController, AbortSignal, Event, EventTarget, structuredClone, queueMicrotask, fetch: globalThis.fetch,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate, performance: globalThis.performance,
  crypto: globalThis.crypto,
}));
context.globalThis = context;
const contextMath = vm.runInContext('Math', context);
const contextRandom = contextMath.random;

/** The MIME bundle of a value: text/plain always; HTML, SVG, PNG, JSON, Markdown by a display method. */
function bundle(value) {
  const data = { 'text/plain': util.inspect(value, { depth: 4, colors: false }) };
  if (value && typeof value === 'object') {
    for (const [method, mime] of [['_repr_html_', 'text/html'], ['_repr_svg_', 'image/svg+xml'], ['_repr_png_', 'image/png'], ['_repr_markdown_', 'text/markdown'], ['_repr_json_', 'application/json'], ['_repr_latex_', 'text/latex']]) {
      if (typeof value[method] === 'function') data[mime] = value[method]();
    }
  }
  return data;
}

context.display = (value) => { if (cell) emit({ id: cell, type: 'result', main: false, data: bundle(value) }); };

/** An error as name, value and traceback; the traceback ends at the cell (the kernel's own frames are cut). */
function errorOf(e) {
  if (e && typeof e === 'object' && 'stack' in e) {
    const lines = String(e.stack ?? '').split('\n');
    const cut = lines.findIndex((l) => /^\s+at .*(node:vm|kernel\.js)/.test(l));
    return { name: String(e.name ?? 'Error'), value: String(e.message ?? ''), traceback: (cut < 0 ? lines : lines.slice(0, cut)).join('\n') };
  }
  return { name: 'Error', value: util.inspect(e), traceback: '' };
}

/** The script a cell runs as: itself, or (top-level await) the body of an async function. */
function compile(code) {
  const filename = `<cell ${count}>`;
  try {
    return new vm.Script(code, { filename });
  } catch (e) {
    if (!(e instanceof SyntaxError) || !/\bawait\b/.test(code)) throw e;
  }
  // Only valid with top-level await: the last line, if it is an expression, becomes the return value.
  const lines = code.trimEnd().split('\n');
  const last = (lines.pop() ?? '').replace(/;\s*$/, '');
  try {
    return new vm.Script(`(async () => {\n${[...lines, `return (${last}\n);`].join('\n')}\n})()`, { filename });
  } catch {
    return new vm.Script(`(async () => {\n${code}\n})()`, { filename });
  }
}

async function execute(cmd) {
  cell = cmd.id;
  if (!cmd.silent) {
    count++;
    emit({ id: cell, type: 'count', execution_count: count });
  }
  contextMath.random = cmd.seed !== undefined ? seededRandom(cmd.seed) : contextRandom;
  try {
    let value = compile(cmd.code).runInContext(context, { breakOnSigint: true, displayErrors: false });
    if (value && typeof value.then === 'function') value = await value;
    if (value !== undefined && !cmd.silent) emit({ id: cell, type: 'result', main: true, data: bundle(value) });
  } catch (e) {
    emit({ id: cell, type: 'error', ...errorOf(e) });
  } finally {
    emit({ id: cell, type: 'done' });
    cell = null;
  }
}

// A SIGINT outside a synchronous run must not end the kernel.
process.on('SIGINT', () => {});
process.on('uncaughtException', (e) => { if (cell) emit({ id: cell, type: 'error', ...errorOf(e) }); });
process.on('unhandledRejection', (e) => { if (cell) emit({ id: cell, type: 'error', ...errorOf(e) }); });

// Commands run one at a time, in order.
let chain = Promise.resolve();
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let cmd;
  try { cmd = JSON.parse(line); } catch { return; }
  if (cmd.op === 'env') {
    for (const [k, v] of Object.entries(cmd.env ?? {})) { if (v === null) delete process.env[k]; else process.env[k] = String(v); }
  } else if (cmd.op === 'execute') {
    chain = chain.then(() => execute(cmd));
  }
}).on('close', () => process.exit(0));

emit({ type: 'ready' });
