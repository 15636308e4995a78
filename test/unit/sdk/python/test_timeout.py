"""The Python SDK's lease (Sandbox.set_timeout) against a server run by test/unit/sdk/timeout.test.ts (a demo key)."""
import os
import sys
import time
import unittest
from datetime import datetime

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class TimeoutTest(unittest.TestCase):
    def test_set_timeout(self) -> None:
        with collimate.Collimate() as client:
            with client.sandboxes.create("base", timeout_secs=60) as sb:
                self.assertIsNotNone(sb.info.session_started_at)
                self.assertLessEqual(sb.info.remaining_secs, 60)
                before = time.time()
                self.assertIs(sb.set_timeout(600), sb)
                self.assertGreaterEqual(epoch(sb.info.expires_at), before + 600 - 0.01)
                self.assertLessEqual(epoch(sb.info.expires_at), time.time() + 600 + 0.01)
                self.assertGreater(sb.info.remaining_secs, 599)
                self.assertEqual(sb.info.timeout_secs, 60)

                with self.assertRaises(collimate.TierForbiddenError) as e:
                    sb.set_timeout(901)
                self.assertEqual(e.exception.code, "tier_forbidden")
                self.assertEqual(e.exception.details["max_session_secs"], 900)
                self.assertTrue(890 < e.exception.details["max_timeout_secs"] <= 900)
                with self.assertRaises(collimate.ValidationError):
                    sb.set_timeout(0)

                sb.suspend()
                self.assertIsNone(sb.info.remaining_secs)
                with self.assertRaises(collimate.InvalidStateError):
                    sb.set_timeout(60)


if __name__ == "__main__":
    unittest.main(verbosity=2)
