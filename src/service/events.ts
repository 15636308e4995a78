/**
 * Sandbox events, a part of the tenant service (tenantService.ts): each tenant's own sandboxes'
 * changes of state, fanned out from one engine subscription to every open event stream (on a
 * cluster host, every host's, from the cluster's event bus).
 */
import type { SandboxTransition } from '../sandboxes/types.js';
import type { Scope } from './types.js';

export type SandboxEventSource = (tenant: string, listener: (t: SandboxTransition) => void) => () => void;

export class SandboxEvents {
  private readonly watchers = new Set<(t: SandboxTransition) => void>();

  /** `source`: where events come from instead of this host's engine (a cluster host's bus). */
  constructor(private readonly source?: SandboxEventSource) {}

  /** A change of state on this host, passed to this host's watchers. */
  feed(t: SandboxTransition): void {
    for (const watcher of this.watchers) watcher(t);
  }

  /**
   * Calls `listener` with every persisted change of state of the tenant's own sandboxes, until the
   * returned unsubscribe is called. An engine without events (a fake) never calls it.
   */
  watch(scope: Scope, listener: (t: SandboxTransition) => void): () => void {
    if (this.source) return this.source(scope.tenant, listener);
    const watcher = (t: SandboxTransition) => {
      if (t.tenant === scope.tenant) listener(t);
    };
    this.watchers.add(watcher);
    return () => this.watchers.delete(watcher);
  }
}
