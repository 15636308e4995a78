import type { LayerAsset } from './guestAssets.js';
import type { ReadyParams } from './bake.js';

/**
 * The catalog: images every tier may create from without a bake of their own. Built locally from
 * Debian packages (no container registry is reachable from these machines).
 */
export interface CatalogEntry {
  id: string;
  description: string;
  /** argv prefix that runs `code`: the code string is appended as the last argument. */
  interpreter: string[];
  /** Language runtimes the image carries and their upstream versions, e.g. `{ node: '24.22.3' }`. */
  runtimes: Record<string, string>;
  vcpus: number;
  memoryMib: number;
  diskMib: number;
  /** Builds (or finds cached) the read-only layers, lowest first. */
  layers(home: string, progress: (m: string) => void): Promise<LayerAsset[]>;
  /** Whether every layer is already built in that cache (then `layers` takes seconds, not minutes); absent: always quick. */
  layersCached?(home: string): boolean;
  /** Run once at bake, before the checkpoint (the code interpreter's server, so its kernel is warm in every sandbox). */
  ready?: ReadyParams;
}

export const CATALOG_DEFAULTS = { vcpus: 1, memoryMib: 256, diskMib: 2048 } as const;
