// The engine of `collimate serve` with one fault point armed, for the crash campaign
// (COLLIMATE_ENGINE_MODULE=test/chaos/faultyEngine.ts). COLLIMATE_CRASH_AT=point[:n] makes the
// server SIGKILL itself the n-th time (default 1) the engine passes that point, like a server
// killed at the worst moment; unset, it is the real engine unchanged.
import { existsSync } from 'node:fs';
import { Engine as RealEngine, type EngineOptions } from '../../src/sandboxes/engine.ts';

// With COLLIMATE_CRASH_ARMED_BY=FILE the point counts only once FILE exists (the campaign checks
// its invariants, resumes included, before it arms the server).
const armedBy = process.env.COLLIMATE_CRASH_ARMED_BY;
// Point names have colons of their own (fork:after-disk): only a trailing number is the count.
const [, point, nth] = /^(.*?)(?::(\d+))?$/.exec(process.env.COLLIMATE_CRASH_AT ?? '')!;
let hits = 0;

export const Engine = {
  open(opts: EngineOptions) {
    // The campaign's sandboxes are all of the base template: the other catalog templates' pools
    // would only slow every restart down.
    const catalog = process.env.COLLIMATE_CHAOS_CATALOG?.split(',');
    if (!point) return RealEngine.open({ ...opts, ...(catalog ? { catalog } : {}) });
    return RealEngine.open({
      ...opts,
      ...(catalog ? { catalog } : {}),
      faultPoint: (name) => {
        if (name !== point || (armedBy && !existsSync(armedBy))) return;
        if (++hits >= Number(nth || 1)) process.kill(process.pid, 'SIGKILL');
      },
    });
  },
};
