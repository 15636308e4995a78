/**
 * The TypeScript SDK package (sdk/typescript, `@collimate/sdk`) without a server: its wire types are
 * the REST API's schemas, and its sources need nothing of the server. The committed
 * wire.generated.ts must be what the schemas render to now; and, checked by the type check (`tsc`),
 * each wire type the SDK uses must be assignable both ways with the zod type it stands for.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { z } from 'zod';
import type * as S from '../../../src/wire/schemas.ts';
import type * as Wire from '../../../sdk/typescript/src/wire.generated.ts';
import { renderWireTypes, WIRE_TYPES_FILE } from '../../../sdk/typescript/scripts/wire-types.ts';

const PACKAGE = fileURLToPath(new URL('../../../sdk/typescript', import.meta.url));

/** `true` only when A and B are assignable to each other (a field added, dropped or made optional breaks it). */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;

// The check can fail:
// @ts-expect-error an optional field is not a required one
const optionalIsNotRequired: Same<{ a?: string }, { a: string }> = true;
// @ts-expect-error an extra field is not the same type
const extraFieldDiffers: Same<{ a: string; b: number }, { a: string }> = true;

// The types the SDK uses, against the schemas: responses as the server sends them, requests as a client writes them.
const sdkTypesMatchSchemas: [
  Same<Wire.Sandbox, z.output<typeof S.Sandbox>>,
  Same<Wire.CreateSandboxResponse, z.output<typeof S.CreateSandboxResponse>>,
  Same<Wire.Snapshot, z.output<typeof S.Snapshot>>,
  Same<Wire.SnapshotList, z.output<typeof S.SnapshotList>>,
  Same<Wire.SandboxState, z.output<typeof S.SandboxState>>,
  Same<Wire.Template, z.output<typeof S.Template>>,
  Same<Wire.OpenPort, z.output<typeof S.OpenPort>>,
  Same<Wire.PortUrl, z.output<typeof S.PortUrl>>,
  Same<Wire.ExecResult, z.output<typeof S.ExecResult>>,
  Same<Wire.Error, z.output<typeof S.ErrorBody>>,
  Same<Wire.EgressPolicy, z.input<typeof S.EgressPolicy>>,
  Same<Wire.ExecFile, z.input<typeof S.ExecFile>>,
  Same<Wire.ExecRequest, z.input<typeof S.ExecRequest>>,
  Same<Wire.CreateSandboxRequest, z.input<typeof S.CreateSandboxRequest>>,
  Same<Wire.ForkRequest, z.input<typeof S.ForkRequest>>,
  Same<Wire.SetTimeoutRequest, z.input<typeof S.SetTimeoutRequest>>,
  Same<Wire.CreateSnapshotRequest, z.input<typeof S.CreateSnapshotRequest>>,
  Same<Wire.RestoreRequest, z.input<typeof S.RestoreRequest>>,
] = [true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, true];
void [optionalIsNotRequired, extraFieldDiffers, sdkTypesMatchSchemas];

test('the committed wire types are what the API schemas render to', () => {
  assert.equal(
    readFileSync(WIRE_TYPES_FILE, 'utf8'),
    renderWireTypes(),
    'sdk/typescript/src/wire.generated.ts differs from src/wire/schemas.ts: run `node --import tsx sdk/typescript/scripts/wire-types.ts`',
  );
});

test('renderWireTypes: shapes, optional and nullable fields, literals, records, loose objects, unions, docs (golden)', () => {
  const registry = z.registry<{ id?: string; description?: string }>();
  const State = z.enum(['on', 'off']);
  registry.add(State, { id: 'State' });
  const Thing = z.strictObject({
    id: z.string().regex(/^t_/),
    state: State,
    parent: z.string().nullable(),
    tags: z.record(z.string(), z.string()),
    argv: z.array(z.array(z.string())).optional(),
    kind: z.literal('thing'),
    flagged: z.literal(true).optional(),
    'odd-key': z.number().int().min(0),
    extra: z.object({ code: z.string() }).loose(),
    either: z.union([z.string(), z.strictObject({ n: z.number() })]),
  });
  registry.add(Thing, { id: 'Thing', description: 'A thing.' });
  registry.add(Thing.shape.parent, { description: 'Where it came from; null at the root.' });
  assert.equal(
    renderWireTypes(registry as any).split('\n').slice(6).join('\n'),
    `export type State = "on" | "off";

/** A thing. */
export type Thing = {
  id: string;
  state: State;
  /** Where it came from; null at the root. */
  parent: string | null;
  tags: Record<string, string>;
  argv?: string[][];
  kind: "thing";
  flagged?: true;
  "odd-key": number;
  extra: {
    code: string;
    [key: string]: unknown;
  };
  either: string | {
    n: number;
  };
};
`,
  );
  const tuples = z.registry<{ id?: string }>();
  tuples.add(z.tuple([z.string(), z.number()]), { id: 'Pair' });
  assert.throws(() => renderWireTypes(tuples as any), /no TypeScript rendering for the JSON Schema/, 'what it cannot render fails the build');
});

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

test('the package sources import only each other and Node built-ins (no server, no runtime dependency)', () => {
  const src = join(PACKAGE, 'src');
  const files = sources(src);
  assert.ok(files.length >= 10, `read the package (${files.length} files)`);
  const re = /(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"]([^'"]+)['"]/g;
  const outside: string[] = [];
  for (const file of files) {
    for (const [, spec] of readFileSync(file, 'utf8').matchAll(re)) {
      const inside = spec.startsWith('.') && resolve(dirname(file), spec).startsWith(src + sep);
      if (!inside && !spec.startsWith('node:')) outside.push(`${relative(PACKAGE, file)} imports ${spec}`);
    }
  }
  assert.deepEqual(outside, []);
  const pkg = JSON.parse(readFileSync(join(PACKAGE, 'package.json'), 'utf8'));
  assert.equal(pkg.name, '@collimate/sdk');
  assert.deepEqual(pkg.dependencies ?? {}, {}, 'zero runtime dependencies');
  assert.deepEqual(Object.keys(pkg.exports), ['.', './rl', './package.json']);
});

test('docs/examples type-check with @collimate/sdk resolved to the package (docs/examples/tsconfig.json)', async () => {
  const root = fileURLToPath(new URL('../../..', import.meta.url));
  const tsc = join(root, 'node_modules/.bin/tsc');
  const r = await promisify(execFile)(tsc, ['-p', join(root, 'docs/examples/tsconfig.json'), '--noEmit'], { cwd: root, timeout: 120_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  for (const example of ['quickstart.ts', 'best_of_n.ts']) {
    assert.match(readFileSync(join(root, 'docs/examples', example), 'utf8'), /from '@collimate\/sdk(\/rl)?';/, `${example} imports the package`);
  }
});
