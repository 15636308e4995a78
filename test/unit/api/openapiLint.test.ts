import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { createConfig, lintFromString } from '@redocly/openapi-core';
import { LICENSE } from '../../../src/api/openapi.js';

const committed = new URL('../../../docs/openapi.json', import.meta.url);

/**
 * Redocly's recommended rules, all of them as failures (warnings included), less one: the licence
 * must name an SPDX identifier or a URL, and the project has granted none yet (UNLICENSED, as in
 * package.json). Once it has one, put it in LICENSE and drop the exception.
 */
const RULES = { extends: ['recommended'], rules: { 'info-license-strict': 'off' } } as const;

test('docs/openapi.json passes the OpenAPI linter (Redocly recommended rules)', async () => {
  const config = await createConfig(RULES as any);
  const problems = await lintFromString({ source: readFileSync(committed, 'utf8'), absoluteRef: committed.pathname, config });
  const lines = problems.map((p) => `${p.severity} ${p.ruleId}: ${p.message} at ${p.location[0]?.pointer}`);
  assert.deepEqual(lines, [], `fix src/api/openapi.ts, then run \`npm run openapi\`:\n${lines.join('\n')}`);
});

test('the linter fails a document that breaks a recommended rule (an operation without a 4xx)', async () => {
  const doc = JSON.parse(readFileSync(committed, 'utf8'));
  const get = doc.paths['/healthz'].get;
  for (const s of Object.keys(get.responses)) if (s.startsWith('4')) delete get.responses[s];
  const problems = await lintFromString({ source: JSON.stringify(doc), absoluteRef: committed.pathname, config: await createConfig(RULES as any) });
  assert.deepEqual(problems.map((p) => p.ruleId), ['operation-4xx-response']);
});

test('the document states the licence package.json states', () => {
  const pkg = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8'));
  assert.equal(LICENSE.name, pkg.license);
  assert.deepEqual(JSON.parse(readFileSync(committed, 'utf8')).info.license, LICENSE);
});
