/** The sandbox service contract against the unit tests' fake (the same suite runs on the real engine in test/integration/contract.test.ts). */
import { FakeSandboxService } from '../../support/fakeSandboxService.js';
import { sandboxServiceContract } from '../../support/sandboxServiceContract.js';

sandboxServiceContract('the in-memory fake', async () => {
  const service = new FakeSandboxService();
  return { service, close: () => service.close() };
});
