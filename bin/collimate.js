#!/usr/bin/env node
// The CLI is TypeScript; register tsx's loader in this process, then run it. Paths resolve from this
// file (not the cwd), so it works from anywhere and through `npm link` / `npx collimate`.
import { register } from 'tsx/esm/api';

register();
await import(new URL('../src/cli/main.ts', import.meta.url).href);
