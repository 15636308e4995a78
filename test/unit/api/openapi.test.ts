import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { buildOpenApi, openApiPath, renderOpenApi } from '../../../src/api/openapi.js';
import { PROXY_METHODS, ROUTES } from '../../../src/api/routes.js';
import { fixture } from './helpers.js';

const committed = new URL('../../../docs/openapi.json', import.meta.url);

test('docs/openapi.json is the generated document (run `npm run openapi` after changing schemas)', () => {
  assert.equal(readFileSync(committed, 'utf8'), renderOpenApi());
});

test('GET /v1/openapi.json serves the same document without auth', async () => {
  const f = await fixture();
  try {
    const r = await f.req('getOpenApi', { url: '/v1/openapi.json' });
    assert.equal(r.statusCode, 200);
    assert.deepEqual(r.json(), buildOpenApi());
  } finally {
    await f.close();
  }
});

test('every route is documented with an operation and every $ref resolves', () => {
  const doc = buildOpenApi();
  assert.equal(doc.openapi, '3.1.0');
  for (const r of ROUTES) {
    const p = openApiPath(r.path);
    for (const m of r.method === 'ANY' ? PROXY_METHODS : [r.method]) assert.ok(doc.paths[p]?.[m.toLowerCase()], `${m} ${p}`);
  }
  const ids = Object.values(doc.paths).flatMap((item: any) => Object.values(item).map((op: any) => op.operationId));
  assert.equal(new Set(ids).size, ids.length, 'operation ids are unique');
  const refs = JSON.stringify(doc).match(/"\$ref":"[^"]+"/g) ?? [];
  for (const ref of refs) {
    const id = ref.slice('"$ref":"#/components/schemas/'.length, -1);
    assert.ok(doc.components.schemas[id], `dangling ${ref}`);
  }
  assert.ok(!JSON.stringify(doc).includes('$defs'), 'no inline $defs: everything shared is a component');
});
