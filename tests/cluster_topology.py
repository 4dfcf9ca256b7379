"""A throw-away Redis Cluster on loopback: N masters with M replicas each, started from Python.

    with ClusterTopology(masters=3, replicas_per_master=1) as topo:
        client = topo.client()                  # redis-py's RedisCluster over it
        master = topo.node_for_key("orders:42") # the RedisServer that owns the key's slot
        topo.failover(topo.replicas_of(master)[0])  # CLUSTER FAILOVER: a clean hand-over
        topo.kill(master)                       # SIGKILL, then
        new = topo.wait_for_promotion(master)   # its replica took its slots

A cluster node speaks TCP (clients and replication) and listens on ``port + 10000`` for the
cluster bus, so each node gets a loopback port picked at run time for which both are free; a
node that loses the race for either exits at once and is started again on another. Slots are
assigned from Python (``CLUSTER ADDSLOTS``, ``MEET``, ``REPLICATE``: no ``redis-cli`` needed),
so the same code runs on Redis 6.2, 7.x and Valkey. ``cluster-node-timeout`` is 1 s, so a
SIGKILLed master is replaced in 2-3 s. Every process is stopped and every temp dir removed on
exit, however the test ended.

"Settled" (what every change waits for) means: every live node says ``cluster_state:ok``,
every live node has the same view of who is master of which slots and who replicates whom,
every dead node is flagged ``fail`` by every live one, and every replica's link is up and
not syncing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from django_rlock.testing import RedisServer, free_port, redis_server_binary
from tests.topology import PORT_ATTEMPTS, Processes, _until

SLOTS = 16384
#: Redis's cluster bus listens on the client port + this (no ``cluster-port`` on 6.2).
BUS_OFFSET = 10000


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A loopback port free right now whose cluster bus port (``+ 10000``) is free too."""
    for _ in range(200):
        port = free_port()
        if port + BUS_OFFSET <= 65535 and _port_free(port + BUS_OFFSET):
            return port
    # The kernel's ephemeral range may lie above 55535: probe a lower range ourselves.
    for port in range(20000, 30000, 7):
        if _port_free(port) and _port_free(port + BUS_OFFSET):
            return port
    raise RuntimeError("no loopback port p with p and p + 10000 both free")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class NodeView:
    """One line of ``CLUSTER NODES`` as one node sees it."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return "fail" in self.flags or "noaddr" in self.flags


def parse_cluster_nodes(text: str) -> dict[str, NodeView]:
    """``CLUSTER NODES`` -> node id -> :class:`NodeView` (slot ranges only; the
    ``[slot->-id]`` migration markers a node shows for itself are skipped)."""
    nodes: dict[str, NodeView] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        node_id, addr, flags, master = parts[0], parts[1], parts[2], parts[3]
        hostport = addr.split("@", 1)[0].split(",", 1)[0]
        port = int(hostport.rsplit(":", 1)[1] or 0)
        ranges: list[tuple[int, int]] = []
        for s in parts[8:]:
            if s.startswith("["):
                continue
            a, _, b = s.partition("-")
            ranges.append((int(a), int(b or a)))
        nodes[node_id] = NodeView(node_id, port, frozenset(flags.split(",")),
                                  None if master == "-" else master, tuple(sorted(ranges)))
    return nodes


class ClusterTopology(Processes):
    """``masters`` masters, each with ``replicas_per_master`` replicas, slots spread evenly.

    ``servers`` keeps every node ever started, in start order (masters first); who is master
    now is the cluster's word (:meth:`masters`). Each node is a :class:`RedisServer` with its
    own directory (``nodes.conf`` in it), a unix socket and a TCP port.
    """

    def __init__(self, masters: int = 3, replicas_per_master: int = 1, *,
                 node_timeout_ms: int = 1000, binary: str | None = None) -> None:
        if masters < 1:
            raise ValueError("a cluster needs a master")
        self.binary = binary or redis_server_binary()
        self.n_masters = masters
        self.n_replicas = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="rlock-cluster-"))
        self.servers: list[RedisServer] = []
        self.ids: dict[int, str] = {}  # port -> node id (a node keeps its id for life)
        self._clients: list[Any] = []
        self._owned: dict[int, tuple[tuple[int, int], ...]] = {}  # port -> slots when killed

    # -- lifecycle -----------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        masters = [self._node(f"master{i}") for i in range(self.n_masters)]
        replicas = [self._node(f"replica{i}-{j}")
                    for i in range(self.n_masters) for j in range(self.n_replicas)]
        per = SLOTS // self.n_masters
        for i, m in enumerate(masters):
            first, last = i * per, (SLOTS - 1 if i == self.n_masters - 1 else (i + 1) * per - 1)
            with self.node_client(m) as c:
                # Distinct config epochs up front (as redis-cli does): no collision to resolve.
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                c.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        for s in self.servers[1:]:
            with self.node_client(s) as c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.servers[0].port)
        every = {self.ids[s.port] for s in self.servers}
        _until(lambda: all(self._known(s) >= every for s in self.servers), timeout,
               "every node knows every other", self.describe)
        for k, r in enumerate(replicas):
            master_id = self.ids[masters[k // self.n_replicas].port]
            with self.node_client(r) as c:
                _until(lambda c=c, m=master_id: c.execute_command("CLUSTER", "REPLICATE", m),
                       timeout, f"CLUSTER REPLICATE on :{r.port}", self.describe)
        # One write per master, so its replicas' offsets leave 0 at once (see _node).
        for m in masters:
            with self.node_client(m) as c:
                slots = parse_cluster_nodes(_text(c.execute_command("CLUSTER", "NODES")))[
                    self.ids[m.port]].slots
                key = key_in_slot_of(slots, "rlock-cluster-setup")
                # (CLUSTERDOWN until the node sees every slot served: try again until then)
                _until(lambda c=c, k=key: c.set(k, 1, px=1), timeout,
                       f"a first write on :{m.port}", self.describe)
        self.wait_settled(timeout)

    def _node(self, name: str) -> RedisServer:
        d = self.dir / name
        d.mkdir()

        def start(port: int) -> RedisServer:
            return RedisServer(str(d), self.binary, port=port, args=[
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # A replica may always take over, however long its link was down (tests kill).
                "--cluster-replica-validity-factor", "0",
                # Diskless sync waits 5 s by default (Redis 7) for more replicas to share it.
                "--repl-diskless-sync-delay", "0",
                # A replica whose offset is still 0 is left out of CLUSTER SLOTS (7.0+), so
                # clients would not see it; the master's pings (10 s apart by default) move it.
                "--repl-ping-replica-period", "1",
                "--logfile", str(d / "redis.log"),
            ]).start()

        last: Exception | None = None
        for _ in range(PORT_ATTEMPTS):
            try:
                server = start(free_cluster_port())
                break
            except RuntimeError as exc:  # exited: most likely a port (or its bus port) taken
                last = exc
        else:
            raise RuntimeError(f"{name}: no free port pair after {PORT_ATTEMPTS} attempts: "
                               f"{self.log_tail(d)}") from last
        self.servers.append(server)
        with self.node_client(server) as c:
            self.ids[server.port] = _text(c.execute_command("CLUSTER", "MYID"))
        return server

    # -- clients ---------------------------------------------------------------------------
    def startup_nodes(self) -> list[redis.cluster.ClusterNode]:
        return [redis.cluster.ClusterNode("127.0.0.1", s.port) for s in self.live()]

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """redis-py's ``RedisCluster`` over the live nodes (closed with the topology)."""
        kwargs.setdefault("socket_timeout", 5)
        c = redis.cluster.RedisCluster(startup_nodes=self.startup_nodes(), **kwargs)
        self._clients.append(c)
        return c

    def async_client(self, **kwargs: Any) -> redis.asyncio.cluster.RedisCluster:
        """redis-py's asyncio ``RedisCluster``; the caller ``await``s ``aclose()`` on its
        own event loop (it cannot be closed from here)."""
        kwargs.setdefault("socket_timeout", 5)
        return redis.asyncio.cluster.RedisCluster(startup_nodes=[
            redis.asyncio.cluster.ClusterNode("127.0.0.1", s.port) for s in self.live()],
            **kwargs)

    def run_async(self, body: Callable[[Any], Awaitable[None]]) -> None:
        """``asyncio.run`` of ``body(client)`` on a fresh asyncio cluster client, closed after
        on the same loop."""
        async def main() -> None:
            arc = self.async_client()
            try:
                await body(arc)
            finally:
                await arc.aclose()

        asyncio.run(main())

    def node_client(self, server: RedisServer, **kwargs: Any) -> redis.Redis:
        """A plain ``redis.Redis`` to one node over TCP (no redirections followed)."""
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis("127.0.0.1", server.port, **kwargs)

    # -- who is who ------------------------------------------------------------------------
    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def node_id(self, server: RedisServer) -> str:
        return self.ids[server.port]

    def live(self) -> list[RedisServer]:
        return [s for s in self.servers if s.proc is not None]

    def view(self, server: RedisServer | None = None) -> dict[str, NodeView]:
        """``CLUSTER NODES`` as ``server`` (default: the first live node) sees it."""
        server = server or self.live()[0]
        with self.node_client(server) as c:
            return parse_cluster_nodes(_text(c.execute_command("CLUSTER", "NODES")))

    def _known(self, server: RedisServer) -> set[str]:
        return {n.id for n in self.view(server).values()
                if not n.flags & {"handshake", "noaddr"}}

    def masters(self) -> list[RedisServer]:
        """The live masters that own slots, in slot order."""
        views = sorted((n for n in self.view().values() if n.is_master and not n.failed
                        and n.slots), key=lambda n: n.slots[0])
        return [self.server(n.port) for n in views]

    def replicas(self) -> list[RedisServer]:
        return [self.server(n.port) for n in self.view().values()
                if "slave" in n.flags and not n.failed]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        mid = self.node_id(master)
        return [self.server(n.port) for n in self.view().values()
                if "slave" in n.flags and n.master_id == mid and not n.failed]

    def master_of_slot(self, slot: int) -> RedisServer:
        for n in self.view().values():
            if n.is_master and not n.failed and any(a <= slot <= b for a, b in n.slots):
                return self.server(n.port)
        raise LookupError(f"no live master owns slot {slot}")

    def keyslot(self, key: str | bytes) -> int:
        """The key's slot by the server's own ``CLUSTER KEYSLOT``."""
        with self.node_client(self.live()[0]) as c:
            return int(c.execute_command("CLUSTER", "KEYSLOT", key))

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The master that owns ``key``'s slot now."""
        return self.master_of_slot(self.keyslot(key))

    # -- waiting ---------------------------------------------------------------------------
    def settled(self) -> bool:
        live = self.live()
        live_ids = {self.ids[s.port] for s in live}
        views = []
        for s in live:
            with self.node_client(s) as c:
                if "cluster_state:ok" not in _text(c.execute_command("CLUSTER", "INFO")):
                    return False
                view = parse_cluster_nodes(_text(c.execute_command("CLUSTER", "NODES")))
                if "slave" in view[self.ids[s.port]].flags:
                    rep = c.info("replication")
                    if rep.get("master_link_status") != "up" or rep.get("master_sync_in_progress"):
                        return False
            alive = {i: (n.is_master, n.master_id, n.slots) for i, n in view.items()
                     if not n.failed and not n.flags & {"handshake", "fail?"}}
            if set(alive) != live_ids:  # a live node unseen, or a dead one not failed yet
                return False
            views.append(alive)
        if any(v != views[0] for v in views[1:]):
            return False
        # What clients discover (CLUSTER SLOTS) must list the same masters and replicas.
        ports = {self.ids[s.port]: s.port for s in live}
        expected = set()
        for i, (is_master, _, slots) in views[0].items():
            if is_master:
                reps = tuple(sorted(ports[j] for j, (m, mid, _) in views[0].items()
                                    if not m and mid == i))
                expected |= {(a, b, ports[i], reps) for a, b in slots}
        for s in live:
            with self.node_client(s) as c:
                got = {(int(e[0]), int(e[1]), int(e[2][1]), tuple(sorted(int(r[1])
                        for r in e[3:]))) for e in c.execute_command("CLUSTER", "SLOTS")}
            if got != expected:
                return False
        covered = sum(b - a + 1 for is_master, _, slots in views[0].values() if is_master
                      for a, b in slots)
        return covered == SLOTS

    def wait_settled(self, timeout: float = 30.0) -> None:
        _until(self.settled, timeout, "cluster settled (state ok, one view, replicas in sync)",
               self.describe)

    def describe(self) -> str:
        """Every live node's ``CLUSTER NODES`` and log tail, for a failure message."""
        out = []
        for s in self.live():
            try:
                with self.node_client(s, socket_timeout=1) as c:
                    nodes = _text(c.execute_command("CLUSTER", "NODES"))
            except (redis.RedisError, OSError) as exc:
                nodes = f"({exc})"
            out.append(f"--- :{s.port} {self.ids.get(s.port, '?')[:8]}\n{nodes}"
                       f"{self.log_tail(Path(s.dir), 600)}")
        return "\n".join(out)

    @staticmethod
    def log_tail(directory: Path, chars: int = 1500) -> str:
        try:
            return (directory / "redis.log").read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # -- topology changes --------------------------------------------------------------
    def failover(self, replica: RedisServer, timeout: float = 30.0) -> RedisServer:
        """``CLUSTER FAILOVER`` on ``replica`` (coordinated with its master: no write lost);
        returns the old master, now a replica of it, once the cluster has settled."""
        mine = self.view(replica)[self.node_id(replica)]
        if mine.master_id is None:
            raise ValueError(f":{replica.port} is not a replica")
        old = self.server(self.view(replica)[mine.master_id].port)
        with self.node_client(replica) as c:
            c.execute_command("CLUSTER", "FAILOVER")
        rid = self.node_id(replica)
        _until(lambda: self.settled() and self.view()[rid].is_master
               and self.view()[self.node_id(old)].master_id == rid, timeout,
               f"replica :{replica.port} promoted by CLUSTER FAILOVER", self.describe)
        return old

    def kill(self, server: RedisServer) -> None:
        """SIGKILL ``server``: its clients see the connection drop, nothing is flushed."""
        assert server.proc is not None
        others = [s for s in self.live() if s is not server]
        if others:  # what it owned, for wait_for_promotion (asked before it is gone)
            self._owned[server.port] = self.view(others[0])[self.node_id(server)].slots
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        server.proc = None

    def wait_for_promotion(self, old_master: RedisServer, timeout: float = 30.0
                           ) -> RedisServer:
        """After :meth:`kill` of a master: block until one of its replicas owns its slots and
        the cluster has settled again; returns the new master."""
        slots = self._owned.get(old_master.port)
        if not slots:
            raise ValueError(f":{old_master.port} was not a master with slots when killed")

        def promoted() -> RedisServer | None:
            if not self.settled():
                return None
            owner = self.master_of_slot(slots[0][0])
            return owner if owner is not old_master else None

        return _until(promoted, timeout, f"a replica of :{old_master.port} promoted",
                      self.describe)

    def revive(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed node again on its port and ``nodes.conf``: it rejoins (a killed
        master comes back as a replica of the node that took its slots)."""
        assert server.proc is None
        server.start()
        self.wait_settled(timeout)

    # -- slot migration ----------------------------------------------------------------------
    def begin_migration(self, slot: int, src: RedisServer, dst: RedisServer) -> None:
        """``SETSLOT IMPORTING`` on ``dst``, then ``MIGRATING`` on ``src`` (redis-cli's order):
        from now on ``src`` answers ``ASK`` for keys of the slot it no longer has."""
        with self.node_client(dst) as d, self.node_client(src) as s:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(src))
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(dst))

    def move_keys(self, slot: int, src: RedisServer, dst: RedisServer,
                  keys: Iterable[str | bytes] | None = None, batch: int = 100) -> int:
        """``MIGRATE`` ``keys`` (default: every key of the slot) from ``src`` to ``dst``;
        returns how many moved."""
        moved = 0
        with self.node_client(src) as s:
            if keys is not None:
                todo = [k for k in keys if s.exists(k)]
                if todo:
                    s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000,
                                      "KEYS", *todo)
                return len(todo)
            while True:
                chunk = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not chunk:
                    return moved
                s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *chunk)
                moved += len(chunk)

    def finish_migration(self, slot: int, src: RedisServer, dst: RedisServer,
                         timeout: float = 30.0) -> None:
        """``SETSLOT NODE dst`` on ``dst``, ``src`` and every other master, then wait until
        every node agrees ``dst`` owns the slot."""
        dst_id = self.node_id(dst)
        others = [m for m in self.masters() if m is not src and m is not dst]
        for node in (dst, src, *others):
            with self.node_client(node) as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

        def agreed() -> bool:
            for s in self.live():
                view = self.view(s)
                if not any(a <= slot <= b for a, b in view[dst_id].slots):
                    return False
            return self.settled()

        _until(agreed, timeout, f"slot {slot} owned by :{dst.port} on every node",
               self.describe)

    def migrate_slot(self, slot: int, src: RedisServer, dst: RedisServer,
                     timeout: float = 30.0) -> int:
        """Move ``slot`` and all its keys from master ``src`` to master ``dst``, as a
        resharding does; returns how many keys moved."""
        self.begin_migration(slot, src, dst)
        moved = self.move_keys(slot, src, dst)
        self.finish_migration(slot, src, dst, timeout)
        return moved


def key_in_slot_of(server_slots: Iterable[tuple[int, int]], base: str = "k") -> str:
    """A key (``base:<n>``) whose slot lies in one of ``server_slots``' ranges."""
    for n in range(100_000):
        key = f"{base}:{n}"
        s = key_slot(key.encode())
        if any(a <= s <= b for a, b in server_slots):
            return key
    raise LookupError("no such key")


def cluster_unsupported(binary: str | None = None, timeout: float = 10.0) -> str | None:
    """Why ``binary`` cannot run a cluster node (None: it can): starts one node, asks it
    ``CLUSTER INFO`` and stops it."""
    binary = binary or redis_server_binary()
    d = tempfile.mkdtemp(prefix="rlock-cluster-probe-")
    server = RedisServer(d, binary, args=["--cluster-enabled", "yes", "--cluster-config-file",
                                          os.path.join(d, "nodes.conf"),
                                          "--logfile", os.path.join(d, "redis.log")])
    try:
        try:
            server.start(timeout)
        except RuntimeError:
            return (f"{binary} does not start with cluster-enabled yes: "
                    f"{ClusterTopology.log_tail(Path(d), 400)}")
        try:
            with server.client() as c:
                c.execute_command("CLUSTER", "INFO")
        except redis.ResponseError as exc:
            return f"{binary} has no cluster support: {exc}"
        return None
    finally:
        server.stop()
        shutil.rmtree(d, ignore_errors=True)


__all__ = ["ClusterTopology", "NodeView", "cluster_unsupported", "free_cluster_port",
           "key_in_slot_of", "parse_cluster_nodes"]
