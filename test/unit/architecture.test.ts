/**
 * The folder structure as a rule: src/ folders import each other without cycles, front doors only
 * reach the core through the tenant service, and the low-level folders (host, vmm, net) never reach
 * up. Reads the import statements of every source file (static, dynamic and type-only alike).
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../../src', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** The src/ folder a file belongs to; a file directly in src/ is a node of its own (e.g. `errors.ts`). */
function folderOf(file: string): string {
  const parts = relative(SRC, file).split(sep);
  return parts.length === 1 ? parts[0] : parts[0];
}

/** Folder → folders it imports (relative imports that stay inside src/). */
export function folderGraph(): Map<string, Set<string>> {
  const graph = new Map<string, Set<string>>();
  const re = /(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"](\.{1,2}\/[^'"]+)['"]/g;
  for (const file of sources(SRC)) {
    const from = folderOf(file);
    const edges = graph.get(from) ?? new Set<string>();
    graph.set(from, edges);
    for (const m of readFileSync(file, 'utf8').matchAll(re)) {
      const target = resolve(dirname(file), m[1]);
      if (!target.startsWith(SRC + sep)) continue;
      const to = folderOf(target.replace(/\.js$/, '.ts'));
      if (to !== from) edges.add(to);
    }
  }
  return graph;
}

/** Every cycle's folders, found by depth-first search (each reported once, from its smallest name). */
export function cycles(graph: Map<string, Set<string>>): string[][] {
  const found = new Map<string, string[]>();
  const walk = (start: string, node: string, path: string[]) => {
    for (const next of graph.get(node) ?? []) {
      if (next === start) {
        const c = [...path];
        const min = c.indexOf([...c].sort()[0]);
        const key = [...c.slice(min), ...c.slice(0, min)];
        found.set(key.join('>'), key);
      } else if (!path.includes(next) && next > start) {
        walk(start, next, [...path, next]);
      }
    }
  };
  for (const n of [...graph.keys()].sort()) walk(n, n, [n]);
  return [...found.values()];
}

test('cycles() finds a cycle when there is one (the check can fail)', () => {
  const g = new Map([['a', new Set(['b'])], ['b', new Set(['c'])], ['c', new Set(['a'])], ['d', new Set(['a'])]]);
  assert.deepEqual(cycles(g), [['a', 'b', 'c']]);
  assert.deepEqual(cycles(new Map([['a', new Set(['b'])], ['b', new Set<string>()]])), []);
});

test('no import cycle among src/ folders', () => {
  const g = folderGraph();
  assert.ok(g.size >= 10, `read the tree (${[...g.keys()]})`);
  assert.deepEqual(cycles(g).map((c) => c.join(' → ')), []);
});

test('layering: front doors reach the core through the tenant service; low folders never reach up', () => {
  const g = folderGraph();
  const imports = (f: string) => [...(g.get(f) ?? [])];
  // MCP, E2B's front door and the SDK (the RL local fleet) render with wire/ and call service/; they never import the REST server.
  for (const door of ['mcp', 'e2b', 'sdk']) assert.ok(!imports(door).includes('api'), `${door}/ imports api/`);
  for (const low of ['host', 'vmm', 'net']) {
    for (const up of ['images', 'sandboxes', 'service', 'api', 'mcp', 'e2b', 'wire', 'cli']) assert.ok(!imports(low).includes(up), `${low}/ imports ${up}/`);
  }
  assert.ok(!imports('images').includes('sandboxes'), 'images/ imports sandboxes/');
  for (const core of ['sandboxes', 'images', 'service', 'wire']) {
    for (const door of ['api', 'mcp', 'e2b', 'cli']) assert.ok(!imports(core).includes(door), `${core}/ imports ${door}/`);
  }
  // server/ assembles the server (config in, a listening server out); only the command line starts it.
  for (const [folder] of g) if (folder !== 'cli') assert.ok(!imports(folder).includes('server'), `${folder}/ imports server/`);
  assert.ok(imports('cli').includes('server'), 'serve starts the server through server/');
});

test('the REST server only translates: no views, no tenant policy, no Fastify below the front doors', () => {
  const server = readFileSync(join(SRC, 'api', 'server.ts'), 'utf8');
  for (const view of ['sandboxView', 'templateView', 'imageView', 'environmentView', 'execResultView', 'toClientError']) {
    assert.ok(!new RegExp(`function ${view}\\b`).test(server), `server.ts defines ${view}`);
  }
  for (const rule of ['.reserve(', 'template_forbidden', 'template_not_ready', 'tier_forbidden', 'egress_forbidden', 'invalidState(']) {
    assert.ok(!server.includes(rule), `server.ts applies a tenant rule (${rule})`);
  }
  for (const file of sources(SRC)) {
    const folder = folderOf(file);
    if (['api', 'mcp', 'cli', 'e2b', 'server'].includes(folder)) continue; // the front doors (e2b: E2B's API and envd), and server/ that assembles them
    assert.ok(!/from 'fastify'/.test(readFileSync(file, 'utf8')), `${relative(SRC, file)} imports fastify`);
  }
});

test("the engine's surface is declared, not cast: no source reaches it through `as { … }`", () => {
  // What the service and the doors use of the engine is SandboxService & HostReadings (sandboxes/types.ts).
  for (const file of sources(SRC)) {
    const casts = readFileSync(file, 'utf8').match(/\bengine\s+as\s+(unknown\s+as\s+)?\{[^}]*\}/g) ?? [];
    assert.deepEqual(casts, [], `${relative(SRC, file)} casts the engine`);
  }
});

test('which headers an error carries is decided in one place (CollimateError.headers), not by each door', () => {
  for (const file of sources(SRC)) {
    if (['errors.ts', join('api', 'openapi.ts')].includes(relative(SRC, file))) continue; // the rule, and its documentation
    assert.ok(!/['"]retry-after['"]/i.test(readFileSync(file, 'utf8')), `${relative(SRC, file)} writes Retry-After itself`);
  }
});

test('cluster mode is beneath the tenant service: no door imports cluster/, and nothing below the doors reads their paths or tool names', () => {
  // The cluster's own HTTP endpoints (peers' operations, blobs, moves) live in api/ beside the doors; they are not doors.
  const clusterEndpoints = ['peerRoutes.ts', 'blobRoutes.ts', 'moveRoutes.ts'].map((f) => join('api', f));
  const re = /(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"](\.{1,2}\/[^'"]+)['"]/g;
  for (const file of sources(SRC)) {
    const rel = relative(SRC, file);
    if (!['api', 'mcp', 'e2b'].includes(folderOf(file)) || clusterEndpoints.includes(rel)) continue;
    for (const m of readFileSync(file, 'utf8').matchAll(re)) {
      const target = relative(SRC, resolve(dirname(file), m[1]));
      assert.ok(!target.startsWith(`cluster${sep}`), `${rel} imports ${target}: a door reaches the cluster only through the tenant service`);
    }
  }
  // Where a request goes and what it costs is decided from the service's operations, never by parsing a door's request.
  const doorWords = [/\/v1\/sandboxes\/:id/, /['"`]\/e2b\//, /\bcreate_sandbox\b/, /\bfork_sandbox\b/, /\bresume_sandbox\b/, /tools\/call/, /['"`]\/mcp\b/];
  for (const file of sources(SRC)) {
    if (!['cluster', 'service', 'sandboxes'].includes(folderOf(file))) continue;
    const text = readFileSync(file, 'utf8').split('\n').filter((l) => !/^\s*(\*|\/\/)/.test(l)).join('\n'); // code, not comments
    for (const w of doorWords) assert.ok(!w.test(text), `${relative(SRC, file)} reads a door's requests (${w.source})`);
  }
});
