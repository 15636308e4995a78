/**
 * Renders the SDK package's wire types (src/wire.generated.ts) from the REST API's zod schemas
 * (src/wire/schemas.ts of the server), by way of the JSON Schema zod derives from them — the same
 * one the OpenAPI document is built from. Pure and deterministic: the committed file must equal
 * renderWireTypes() (test/unit/sdk/wireTypes.test.ts), and the package's build writes it again
 * (`npm run build` in sdk/typescript; alone: `node --import tsx sdk/typescript/scripts/wire-types.ts`).
 *
 * Only what a TypeScript type can say is kept: shapes, optionality, literals, nullability and the
 * descriptions (as doc comments). Lengths, ranges, patterns and refinements stay the server's to
 * check. A JSON Schema construct this does not know fails the render instead of being guessed at.
 */
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { apiRegistry } from '../../../src/wire/schemas.js';

type Json = { [key: string]: any };

export const WIRE_TYPES_FILE = fileURLToPath(new URL('../src/wire.generated.ts', import.meta.url));

const HEADER = `/**
 * The REST API's wire types, generated from its zod schemas (src/wire/schemas.ts of the server) by
 * sdk/typescript/scripts/wire-types.ts. Do not edit: the package's build writes this file again, and
 * a unit test fails when it differs from what the schemas give.
 */
`;

/** The TypeScript module of every schema in `registry` with an `id` (by default: the API's), in registry order. */
export function renderWireTypes(registry: typeof apiRegistry = apiRegistry): string {
  const { schemas } = z.toJSONSchema(registry, { io: 'output', uri: (id: string) => id, metadata: registry } as any) as {
    schemas: Record<string, Json>;
  };
  const out = [HEADER];
  for (const [id, { $schema, $id, description, ...schema }] of Object.entries(schemas)) {
    out.push(`${doc(description, '')}export type ${id} = ${typeOf(schema, '')};\n`);
  }
  return out.join('\n');
}

function doc(description: unknown, indent: string): string {
  if (typeof description !== 'string' || description === '') return '';
  return `${indent}/** ${description.replaceAll('*/', '*\\/')} */\n`;
}

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

function typeOf(s: Json, indent: string): string {
  if (s.$ref !== undefined) return s.$ref;
  const union = s.oneOf ?? s.anyOf;
  if (union) return (union as Json[]).map((branch) => typeOf(branch, indent)).join(' | ');
  if ('const' in s) return JSON.stringify(s.const);
  if (s.enum) return (s.enum as unknown[]).map((v) => JSON.stringify(v)).join(' | ');
  if (Array.isArray(s.type)) return (s.type as string[]).map((t) => typeOf({ ...s, type: t }, indent)).join(' | ');
  switch (s.type) {
    case 'string':
      return 'string';
    case 'number':
    case 'integer':
      return 'number';
    case 'boolean':
      return 'boolean';
    case 'null':
      return 'null';
    case 'array': {
      if (typeof s.items !== 'object' || s.prefixItems) break; // a tuple
      const item = typeOf(s.items, indent);
      return /^[\w"]+(\[\])*$/.test(item) ? `${item}[]` : `Array<${item}>`;
    }
    case 'object':
      return objectType(s, indent);
    case undefined:
      if (Object.keys(s).every((k) => k === 'description')) return 'unknown';
  }
  throw new Error(`wire types: no TypeScript rendering for the JSON Schema ${JSON.stringify(s)}`);
}

function objectType(s: Json, indent: string): string {
  const props = Object.entries((s.properties ?? {}) as Record<string, Json>);
  const extra = s.additionalProperties as Json | false | undefined;
  if (props.length === 0 && extra) return `Record<string, ${typeOf(extra, indent)}>`;
  const extraType = extra ? typeOf(extra, indent + '  ') : undefined;
  const required = new Set<string>(s.required ?? []);
  const lines = props.map(([key, prop]) => {
    const name = IDENTIFIER.test(key) ? key : JSON.stringify(key);
    return `${doc(prop.description, indent + '  ')}${indent}  ${name}${required.has(key) ? '' : '?'}: ${typeOf(prop, indent + '  ')};`;
  });
  // A loose object: fields may be added over time, and clients must ignore the ones they do not know.
  if (extraType !== undefined) lines.push(`${indent}  [key: string]: ${extraType};`);
  return lines.length === 0 ? 'Record<string, never>' : `{\n${lines.join('\n')}\n${indent}}`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(WIRE_TYPES_FILE, renderWireTypes());
}
