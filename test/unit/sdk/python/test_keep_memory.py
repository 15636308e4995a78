"""The Python SDK's suspend with keep_memory, against a server run by test/unit/sdk/keepMemory.test.ts
(COLLIMATE_API_KEY is a pro tenant's key)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402


class KeepMemoryTest(unittest.TestCase):
    def test_suspend_keeps_only_the_files_when_asked(self) -> None:
        with collimate.Collimate() as client:
            with client.sandboxes.create("base", keep_memory=False) as sb:
                self.assertFalse(sb.info.keep_memory)
                self.assertIsNone(sb.info.memory_kept)
                sb.suspend()
                self.assertEqual((sb.info.state, sb.info.memory_kept), ("suspended", False))
                sb.resume()
                sb.suspend(keep_memory=True)
                self.assertTrue(sb.info.memory_kept)
            with client.sandboxes.create("base") as plain:
                self.assertTrue(plain.info.keep_memory)
                plain.suspend(keep_memory=False)
                self.assertFalse(plain.info.memory_kept)


if __name__ == "__main__":
    unittest.main()
