"""Fleets: every sandbox a Fleet creates or forks, and every snapshot its sandboxes take, carries the
run label ``{collimate_run: run_id}``, so what a crashed trainer left can always be found and swept
(see :func:`collimate_rl.sweep`)."""
from __future__ import annotations

import datetime
import os
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Union

from collimate import Collimate, Execution, Sandbox, Snapshot
from collimate.types import SandboxInfo

__all__ = ["RUN_LABEL", "new_run_id", "new_seed", "Fleet", "RunSandbox", "connect"]

#: The label key every sandbox of a run carries (the same as the TypeScript RL SDK's).
RUN_LABEL = "collimate_run"


def new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d%H%M%S")
    return f"run-{stamp}-{os.urandom(4).hex()}"


def new_seed() -> str:
    """A fresh u64 seed as the API writes one (a decimal string), drawn as the server draws exec seeds."""
    return str(int.from_bytes(os.urandom(8), "little"))


class RunSandbox(Sandbox):
    """A collimate Sandbox whose forks and snapshots carry its fleet's run label, and whose code cells
    always run seeded."""

    _fleet: "Fleet"

    def _wrap(self, info: Mapping[str, Any]) -> "RunSandbox":
        sb = RunSandbox(self._client, SandboxInfo.from_json(info))
        sb._fleet = self._fleet
        return sb

    def fork(self, n: int = 1, *, labels: Optional[Mapping[str, str]] = None) -> List["RunSandbox"]:  # type: ignore[override]
        return super().fork(n, labels={**(labels or {}), **self._fleet.run_label})  # type: ignore[return-value]

    def snapshot(self, *, name: Optional[str] = None, labels: Optional[Mapping[str, str]] = None) -> Snapshot:
        return super().snapshot(name=name, labels={**(labels or {}), **self._fleet.run_label})

    def run_code(self, code: str, *, seed: Union[str, int, None] = None, **kw: Any) -> Execution:
        """``Sandbox.run_code`` with a seed drawn when none is given, as the server draws one for every
        exec: the result records it (``seed``), so a step's cell replays with ``run_code(code,
        seed=result.seed)`` in the same kernel state (e.g. another fork of the same node)."""
        return super().run_code(code, seed=new_seed() if seed is None else seed, **kw)


class Fleet:
    """Sandboxes of one training run over HTTP. One persistent keep-alive connection serves a
    sequential caller; each extra thread gets (and keeps reusing) its own."""

    def __init__(self, client: Collimate, run_id: Optional[str] = None) -> None:
        self.client = client
        self.run_id = run_id or new_run_id()
        self.run_label: Dict[str, str] = {RUN_LABEL: self.run_id}

    def _adopt(self, sb: Sandbox) -> RunSandbox:
        r = RunSandbox(self.client, sb.info)
        r._fleet = self
        return r

    def create(self, template: str = "base", *, labels: Optional[Mapping[str, str]] = None, timeout_secs: Optional[int] = None) -> RunSandbox:
        return self._adopt(self.client.sandboxes.create(template, labels={**(labels or {}), **self.run_label}, timeout_secs=timeout_secs))

    def get(self, sandbox_id: str) -> RunSandbox:
        return self._adopt(self.client.sandboxes.get(sandbox_id))

    def list_ids(self, *, labels: Optional[Mapping[str, str]] = None, state: Optional[str] = None) -> List[str]:
        return [sb.id for sb in self.client.sandboxes.list(labels=labels, state=state, limit=1000).all()]

    def delete_by_id(self, sandbox_id: str) -> None:
        self.client.http.request("DELETE", "/v1/sandboxes/" + urllib.parse.quote(sandbox_id, safe=""))

    def list_snapshot_ids(self, *, labels: Optional[Mapping[str, str]] = None) -> List[str]:
        """Ids of the tenant's snapshots with every label given (all pages)."""
        return [s.id for s in self.client.snapshots.list(labels=labels, limit=1000).all()]

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot; NotFoundError when it is already gone."""
        self.client.snapshots.delete(snapshot_id)

    def sweep(self, run_id: Optional[str] = None, *, quiet_secs: float = 2.0) -> int:
        from .helpers import sweep

        return sweep(self, run_id or self.run_id, quiet_secs=quiet_secs)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(base_url: Optional[str] = None, api_key: Optional[str] = None, *, run_id: Optional[str] = None, timeout: float = 60.0) -> Fleet:
    """A Fleet over HTTP (defaults: COLLIMATE_BASE_URL, COLLIMATE_API_KEY, a fresh run id)."""
    return Fleet(Collimate(api_key=api_key, base_url=base_url, timeout=timeout), run_id)

