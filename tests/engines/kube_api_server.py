"""Serves kmock's Kubernetes emulator on 127.0.0.1 until killed; run by `fake_cluster.KubeApi`.

Usage: python kube_api_server.py PORT_FILE. Once it listens, it writes its port to PORT_FILE.

The emulator is stock kmock plus what a real API server does on its own and the engine under
test may rely on:

- every built-in resource is declared up front (stock kmock answers 404 to a list of pods until
  the first pod exists);
- a created object gets `metadata.namespace` from its URL (stock kmock's namespaced watches
  skip objects that lack it), a `uid`, a `creationTimestamp`, a name from `generateName`, and a
  pod gets `status.phase: Pending`;
- a patch whose body names `metadata.uid` fails with 409 when the stored object's uid differs
  (Kubernetes' uid precondition), so a report about a deleted pod never lands on a new pod of
  the same name.
"""

import asyncio
import datetime
import os
import secrets
import sys
import uuid

import kmock

HOST = "127.0.0.1"


class RealisticEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the defaults and uid precondition of a real API server."""

    async def _handle(self, request):
        if isinstance(request.data, dict) and request.resource is not None:
            if request.action == kmock.action.CREATE:
                _fill_defaults(request)
            elif request.action == kmock.action.UPDATE:
                self._check_uid(request)
        return await super()._handle(request)

    def _check_uid(self, request):
        wanted = (request.data.get("metadata") or {}).get("uid")
        key = (request.resource, request.namespace, request.name)
        if not wanted or key not in self.objects or self.objects[key].deleted:
            return
        stored = (self.objects[key].raw.get("metadata") or {}).get("uid")
        if stored != wanted:
            raise kmock.KubernetesError(
                status=409, reason="Conflict",
                message=f"Precondition failed: UID in precondition: {wanted}, "
                        f"UID in object meta: {stored}")


def _fill_defaults(request):
    metadata = request.data.setdefault("metadata", {})
    if request.namespace:
        metadata.setdefault("namespace", request.namespace)
    if "name" not in metadata and metadata.get("generateName"):
        metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
    metadata.setdefault("uid", str(uuid.uuid4()))
    metadata.setdefault("creationTimestamp", datetime.datetime.now(
        datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    if request.resource.plural == "pods":
        request.data.setdefault("status", {}).setdefault("phase", "Pending")


async def serve(port_file):
    async with RealisticEmulator() as emulator, kmock.Server(emulator, host=HOST) as server:
        emulator.resources.load_bundled()
        with open(f"{port_file}.tmp", "w") as f:
            f.write(str(server.port))
        os.replace(f"{port_file}.tmp", port_file)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
