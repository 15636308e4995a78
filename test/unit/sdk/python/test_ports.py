"""The Python SDK's networking surface against a server run by test/unit/sdk/ports.test.ts.

It prints ``SANDBOX <id>`` once it created a sandbox and reads a line from stdin once the test made
a server "listen" in it (the fake service's port table).
"""
import json
import os
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402

PORT = int(os.environ["TEST_PORT"])


class PortsTest(unittest.TestCase):
    def test_egress_ports_urls_requests(self) -> None:
        client = collimate.Collimate()
        with client.sandboxes.create("python", egress={"domains": ["PyPI.org"], "ports": [443]}) as sb:
            self.assertEqual(sb.egress, {"domains": ["pypi.org"], "cidrs": [], "ports": [443]})
            self.assertEqual(sb.info.ports, [])
            print(f"SANDBOX {sb.id}", flush=True)
            sys.stdin.readline()

            ports = sb.ports()
            self.assertEqual(ports, [collimate.OpenPort(port=PORT, protocol="tcp", url=f"{client.base_url}/v1/sandboxes/{sb.id}/ports/{PORT}/")])

            r = sb.request(PORT, "/items?x=1", method="POST", body="payload", headers={"content-type": "text/plain"})
            self.assertIsInstance(r, collimate.PortResponse)
            self.assertEqual((r.status, r.headers["x-app"]), (200, "yes"))
            self.assertEqual(r.json(), {"method": "POST", "url": "/items?x=1", "body": "payload", "auth": None})
            self.assertEqual(sb.request(PORT, "missing").status, 404)
            with self.assertRaises(collimate.PortUnreachableError) as e:
                sb.request(PORT + 1)
            self.assertEqual((e.exception.code, e.exception.status), ("port_unreachable", 502))

            url = sb.port_url(PORT, expires_in_secs=120)
            self.assertTrue(url.startswith(f"{client.base_url}/v1/p/") and url.endswith("/"), url)
            with urllib.request.urlopen(url + "open?y=2") as resp:
                self.assertEqual(json.loads(resp.read()), {"method": "GET", "url": "/open?y=2", "body": "", "auth": None})
            with self.assertRaises(collimate.ValidationError):
                sb.port_url(0)

            with self.assertRaises(collimate.EgressForbiddenError) as f:
                client.sandboxes.create("node", egress="allow")
            self.assertIsInstance(f.exception, collimate.TierForbiddenError)
            with self.assertRaises(collimate.ValidationError):
                client.sandboxes.create("python", egress={"domains": ["no spaces.com"]})

            # Public ports: a request with no key reaches the port.
            with client.sandboxes.create("python", public_ports=True, port_host="app.test:${PORT}") as pub:
                self.assertEqual((pub.public_ports, pub.port_host, sb.public_ports, sb.port_host), (True, "app.test:${PORT}", False, None))
                with urllib.request.urlopen(f"{client.base_url}/v1/sandboxes/{pub.id}/ports/{PORT}/hi") as resp:
                    self.assertEqual(json.loads(resp.read())["url"], "/hi")
            with self.assertRaises(collimate.ValidationError):
                client.sandboxes.create("python", port_host="no spaces")
        self.assertTrue(issubclass(collimate.UrlExpiredError, collimate.AuthenticationError))
        self.assertTrue(issubclass(collimate.NetworkUnavailableError, collimate.InvalidStateError))
        client.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
