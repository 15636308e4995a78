/**
 * collimate-rl for code inside this repository: the package's RL SDK (`@collimate/sdk/rl`, whose
 * fleet is connect(), over REST) plus the in-process fleet that only a process holding the tenant
 * service can use, so it stays here beside the server:
 *
 *   const fleet = createLocalFleet(tenants, trustedScope(tenant));   // no HTTP hop
 */
export * from '../../../sdk/typescript/src/rl/index.js';
export { createLocalFleet, LocalFleet, LocalSandbox, type LocalFleetOptions } from './local.js';
