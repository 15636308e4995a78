"""The Python SDK's files API against a server run by test/unit/sdk/files.test.ts (upload limit 2 MiB)."""
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402


class FilesTest(unittest.TestCase):
    def test_files(self) -> None:
        tmp = os.environ["COLLIMATE_TEST_DIR"]
        with collimate.Collimate() as client:
            with client.sandboxes.create("base") as sb:
                self.assertTrue(sb.files.mkdir("/py/in", mode=0o750))
                self.assertFalse(sb.files.mkdir("/py/in"))
                sb.files.write("/py/in/a.txt", "alpha")
                entry = sb.files.stat("/py/in/a.txt")
                self.assertIsInstance(entry, collimate.FileEntry)
                self.assertEqual((entry.type, entry.size, entry.permissions), ("file", 5, "rw-r--r--"))
                self.assertIsInstance(entry.mtime_ns, int)
                self.assertTrue(sb.files.exists("/py/in"))
                self.assertFalse(sb.files.exists("/py/none"))
                self.assertEqual([e.path for e in sb.files.list("/py", depth=2)], ["/py/in", "/py/in/a.txt"])
                self.assertEqual(sb.files.list_page("/py")[1], False)
                self.assertEqual(sb.files.rename("/py/in/a.txt", "/py/b.txt").path, "/py/b.txt")
                with self.assertRaises(collimate.NotFoundError) as nf:
                    sb.files.stat("/py/in/a.txt")
                self.assertEqual(nf.exception.code, "file_not_found")
                with self.assertRaises(collimate.FileConflictError) as fc:
                    sb.files.mkdir("/py/b.txt")
                self.assertEqual((fc.exception.code, fc.exception.status), ("file_exists", 409))

                data = os.urandom(1536 * 1024 + 3)
                up = os.path.join(tmp, "py-up.bin")
                with open(up, "wb") as f:
                    f.write(data)
                self.assertEqual(sb.files.upload_from(up, "/py/blob.bin", mode=0o600), {"path": "/py/blob.bin", "size": len(data)})
                down = os.path.join(tmp, "py-down.bin")
                self.assertEqual(sb.files.download_to("/py/blob.bin", down), len(data))
                with open(down, "rb") as f:
                    self.assertEqual(f.read(), data)
                self.assertEqual(b"".join(sb.files.download("/py/blob.bin")), data)
                self.assertEqual(sb.files.upload("/py/gen.bin", (bytes([i]) * 1000 for i in range(10)))["size"], 10_000)
                with self.assertRaises(collimate.PayloadTooLargeError):
                    sb.files.upload("/py/huge.bin", (b"\0" * (512 * 1024) for _ in range(6)))
                # A body far over the limit: the server reads and drops the rest before it answers.
                for _ in range(3):
                    with self.assertRaises(collimate.PayloadTooLargeError):
                        sb.files.upload("/py/huge.bin", (b"\0" * (512 * 1024) for _ in range(80)))
                with self.assertRaises(collimate.NotFoundError):
                    sb.files.download_to("/py/none", os.path.join(tmp, "py-none.bin"))
                self.assertFalse(any(n.startswith("py-none") for n in os.listdir(tmp)), "a failed download leaves no partial file")

                events = []

                def watch() -> None:
                    for ev in sb.files.watch("/py", recursive=True):
                        events.append(ev)

                t = threading.Thread(target=watch)
                t.start()
                time.sleep(0.3)
                sb.files.write("/py/in/new.txt", "x")
                self.assertEqual(sb.files.remove("/py/b.txt"), 1)
                deadline = time.time() + 5
                while len(events) < 2 and time.time() < deadline:
                    time.sleep(0.02)
                sb.suspend()
                t.join(5)
                self.assertFalse(t.is_alive())
                self.assertEqual(
                    [(e.type, e.op, e.name, e.reason) for e in events],
                    [("change", "create", "in/new.txt", None), ("change", "remove", "b.txt", None), ("end", None, None, "sandbox_suspended")],
                )


if __name__ == "__main__":
    unittest.main()
