/** The sandbox service contract against the real engine on microVMs (the same suite runs on the fake in test/unit/sandboxes/contract.test.ts). */
import { rmSync } from 'node:fs';
import { sandboxServiceContract } from '../support/sandboxServiceContract.ts';
import { assertNoLeaks, openEngine, testHome } from './fixture.ts';

sandboxServiceContract('the engine', async () => {
  const home = testHome('contract');
  const engine = await openEngine(home, { catalog: ['base'], poolSize: 1 });
  return {
    service: engine,
    close: async () => {
      await assertNoLeaks(engine, home);
      rmSync(home, { recursive: true, force: true });
    },
  };
});
