/**
 * collimate-rl: fleets of sandboxes for training loops.
 *
 *   const fleet = connect();                               // over HTTP (COLLIMATE_BASE_URL/_API_KEY)
 *   const root = await fleet.create('base');
 *   const { winner } = await bestOfN(root, 4, (sb, i) => sb.exec({ command: `./try ${i}` }), (r) => Number(r.stdout));
 *   const state = await root.snapshot();                   // a stored state, kept until deleted
 *   await bestOfN({ fleet, snapshot: state }, 4, step, score); // children started from it
 *   await fleet.sweep();                                   // everything this run created
 */
export {
  RUN_LABEL,
  newRunId,
  newSeed,
  storedStateId,
  type Fleet,
  type Sandbox,
  type CreateOptions,
  type SweepOptions,
  type SnapshotOptions,
  type StoredState,
  type StoredStateRef,
} from './fleet.js';
export { connect, RemoteFleet, RemoteSandbox, type ConnectOptions } from './remote.js';
export {
  bestOfN,
  treeSearch,
  map,
  mapSandboxes,
  sweep,
  type Origin,
  type BestOfNOptions,
  type BestOfNResult,
  type Scored,
  type TreeSearchOptions,
  type TreeSearchResult,
  type TreeNodeContext,
  type MapOptions,
  type MapSandboxesOptions,
} from './helpers.js';
