"""The Python SDK's snapshots against a server run by test/unit/sdk/snapshots.test.ts.

COLLIMATE_API_KEY is a pro tenant's key, OTHER_API_KEY another pro tenant's, DEMO_API_KEY a demo
tenant's (whose snapshots quota is 5).
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402
import collimate_rl as rl  # noqa: E402


def ids(snapshots):
    return sorted(s.id for s in snapshots)


class SnapshotsTest(unittest.TestCase):
    def test_snapshot_start_restore_list_delete(self) -> None:
        with collimate.Collimate() as client, client.sandboxes.create("python", labels={"role": "origin"}) as sb:
            self.assertIsNone(sb.from_snapshot)
            sb.files.write("/root/state.txt", "v1")

            snap = sb.snapshot(name="after v1", labels={"step": "1"})
            self.assertIsInstance(snap, collimate.Snapshot)
            self.assertRegex(snap.id, r"^snap_[0-9a-f]{16}$")
            self.assertEqual(
                (snap.name, snap.labels, snap.sandbox_id, snap.template, snap.vcpus, snap.memory_mib, snap.egress),
                ("after v1", {"step": "1"}, sb.id, "python", sb.info.vcpus, sb.info.memory_mib, sb.egress),
            )
            plain = sb.snapshot()
            self.assertEqual((plain.name, plain.labels), (None, {}))

            # Rolled back in place while running: same id, the snapshot's files, runs on.
            sb.files.write("/root/state.txt", "v2")
            self.assertIs(sb.restore(snap), sb)
            self.assertEqual((sb.state, sb.from_snapshot), ("running", snap.id))
            self.assertEqual(sb.files.read("/root/state.txt"), b"v1")

            # A suspended one stays suspended at it; by id as well as by object.
            sb.files.write("/root/state.txt", "v3")
            sb.suspend()
            sb.restore(plain.id)
            self.assertEqual((sb.state, sb.from_snapshot), ("suspended", plain.id))
            sb.resume()
            self.assertEqual(sb.files.read("/root/state.txt"), b"v1")

            with client.sandboxes.from_snapshot(snap.id, labels={"role": "copy"}, timeout_secs=120) as one:
                self.assertNotEqual(one.id, sb.id)
                self.assertEqual(
                    (one.state, one.template, one.from_snapshot, one.labels, one.info.timeout_secs),
                    ("running", "python", snap.id, {"role": "copy"}, 120),
                )
                self.assertEqual(one.files.read("/root/state.txt"), b"v1")

                many = client.sandboxes.many_from_snapshot(snap, 3, labels={"role": "many"})
                self.assertEqual(len(many), 3)
                self.assertEqual(len({sb.id, one.id, *(s.id for s in many)}), 5)
                for s in many:
                    self.assertEqual((s.state, s.from_snapshot, s.labels), ("running", snap.id, {"role": "many"}))
                    self.assertEqual(s.files.read("/root/state.txt"), b"v1")
                self.assertEqual(sorted(s.id for s in client.sandboxes.list(labels={"role": "many"}).all()), sorted(s.id for s in many))
                for s in many:
                    s.delete()
                with self.assertRaises(collimate.ValidationError):
                    client.sandboxes.many_from_snapshot(snap, 0)

                # Get, list (filters and pages), delete.
                self.assertEqual(client.snapshots.get(snap.id), snap)
                of_one = one.snapshot(labels={"step": "2"})
                self.assertEqual(ids(client.snapshots.list().all()), ids([snap, plain, of_one]))
                self.assertEqual(ids(client.snapshots.list(sandbox_id=sb.id).all()), ids([snap, plain]))
                self.assertEqual(ids(client.snapshots.list(labels={"step": "2"}).all()), [of_one.id])
                pages = list(client.snapshots.list(limit=2))
                self.assertEqual([len(p) for p in pages], [2, 1])
                self.assertEqual(ids(s for p in pages for s in p), ids([snap, plain, of_one]))

                client.snapshots.delete(plain)
                client.snapshots.delete(of_one.id)
                with self.assertRaises(collimate.NotFoundError) as gone:
                    client.snapshots.get(plain.id)
                self.assertEqual(gone.exception.code, "snapshot_not_found")
                with self.assertRaises(collimate.NotFoundError):
                    client.snapshots.delete(plain.id)
                with self.assertRaises(collimate.NotFoundError):
                    client.sandboxes.from_snapshot(plain.id)
                self.assertEqual(ids(client.snapshots.list().all()), [snap.id])

                # A sandbox rolls back only to its own snapshots; other tenants see none of them.
                with self.assertRaises(collimate.SnapshotMismatchError) as mismatch:
                    one.restore(snap)
                self.assertIsInstance(mismatch.exception, collimate.InvalidStateError)
                self.assertEqual((mismatch.exception.code, mismatch.exception.status), ("snapshot_mismatch", 409))
            with collimate.Collimate(api_key=os.environ["OTHER_API_KEY"]) as other:
                with self.assertRaises(collimate.NotFoundError):
                    other.snapshots.get(snap.id)
                self.assertEqual(other.snapshots.list().all(), [])
            client.snapshots.delete(snap)

    def test_snapshots_quota(self) -> None:
        with collimate.Collimate(api_key=os.environ["DEMO_API_KEY"]) as client, client.sandboxes.create("base") as sb:
            for _ in range(5):
                sb.snapshot()
            with self.assertRaises(collimate.QuotaExceededError) as refused:
                sb.snapshot()
            self.assertEqual(refused.exception.quota, "snapshots")


    def test_rl_sweep_deletes_the_runs_snapshots(self) -> None:
        fleet = rl.connect(run_id="py-sweep-run")
        other = rl.connect(run_id="py-other-run")
        with fleet, other:
            keep = other.create("base")
            kept = keep.snapshot(name="another run")
            root = fleet.create("base")
            state = root.snapshot(name="step 1", labels={"k": "v"})
            self.assertEqual(state.labels, {"k": "v", rl.RUN_LABEL: "py-sweep-run"})
            [kid] = root.fork(1)
            kid_state = kid.snapshot()
            self.assertEqual(sorted(fleet.list_snapshot_ids(labels=fleet.run_label)), sorted([state.id, kid_state.id]))
            # The root, its fork and both snapshots; another run's sandbox and snapshot stay.
            self.assertEqual(fleet.sweep(quiet_secs=0.01), 4)
            self.assertEqual(fleet.list_snapshot_ids(labels=fleet.run_label), [])
            self.assertEqual(fleet.list_ids(labels=fleet.run_label), [])
            with self.assertRaises(collimate.NotFoundError):
                fleet.delete_snapshot(state.id)
            self.assertEqual(other.list_snapshot_ids(labels=other.run_label), [kept.id])
            self.assertEqual(other.sweep(quiet_secs=0.01), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
