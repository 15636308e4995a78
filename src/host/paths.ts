import { join } from 'node:path';

/** Layout of the data directory (COLLIMATE_HOME, default ~/.collimate). */
export function homePaths(home: string) {
  return {
    home,
    blobs: join(home, 'blobs', 'sha256'),
    assets: join(home, 'assets'),
    artifacts: join(home, 'artifacts'),
    sandboxes: join(home, 'sandboxes'),
    /** qcow2 disk layers of sandboxes and fork points, by path; shared within a fork tree. */
    disks: join(home, 'disks'),
    snapshots: join(home, 'snapshots'),
    tmp: join(home, 'tmp'),
    db: join(home, 'collimate.db'),
  };
}
