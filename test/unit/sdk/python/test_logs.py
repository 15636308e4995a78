"""The Python SDK's sandbox logs against a server run by test/unit/sdk/logs.test.ts (COLLIMATE_API_KEY: a pro tenant's key)."""
import datetime
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402


class LogsTest(unittest.TestCase):
    def test_logs_filters_and_errors(self) -> None:
        with collimate.Collimate() as client, client.sandboxes.create("python") as sb:
            sb.exec("echo first")
            sb.exec("exit 4")
            entries = sb.logs()
            self.assertTrue(all(isinstance(e, collimate.SandboxLogEntry) for e in entries))
            self.assertEqual([e.fields.get("event") for e in entries], ["lifecycle", "exec", "exec"])
            self.assertEqual([e.fields["command"] for e in sb.logs(level="warn")], ["exit 4"])
            self.assertEqual([e.level for e in sb.logs(search="echo first")], ["info"])
            self.assertEqual([e.message for e in sb.logs(direction="backward", limit=1)], [entries[2].message])
            at = datetime.datetime.fromisoformat(entries[2].timestamp.replace("Z", "+00:00"))
            self.assertEqual([e.message for e in sb.logs(cursor=at)], [e.message for e in sb.logs(cursor=int(at.timestamp() * 1000))])
            self.assertGreaterEqual(len(sb.logs(cursor=at)), 1)
            with self.assertRaises(collimate.ValidationError):
                sb.logs(limit=0)


if __name__ == "__main__":
    unittest.main()
