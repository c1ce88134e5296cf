"""The mover: a standalone store moved online to another layout (more or fewer standalone shards, or a Redis
Cluster), every key kept, applications running.

Why this module is long: the migration is one state machine (mark, copy, catch up, cut over, clean up), and
each step's checks and refusals sit beside it so the whole protocol reads in one place.

The protocol (the markers' side is :mod:`zcluster._moves`):

1. **Mark.** The source's layout is settled (a store without markers is adopted first, as any client would);
   the target is checked (bad input refused before anything moves); each shard only of the target gets the
   target's marker with ``incoming``; each source shard's marker gets ``move`` in state ``copying``.
   Clients notice nothing: they keep reading and writing the source, which stays complete.
2. **Copy.** A keyspace listener subscribes on each source shard (:mod:`zcluster.migration._copier`), then
   a pass SCANs each source shard and copies every key the target routes to another server (DUMP,
   RESTORE REPLACE: a 2P-set with its tombstones and floor, an aggregate with its fences, a checkpoint, a
   dedup entry: any key of the namespaces, whole). Keys that stay on a server of both layouts are not
   copied.
3. **Catch up.** The keys changed since they were copied (the listeners' sets) are copied again, in rounds,
   until a round finds at most ``cutover_keys`` of them.
4. **Cut over** (the only pause). Each source marker goes to ``cutting`` and every normal client connection
   of the source server is closed (``CLIENT KILL TYPE normal``): a client's next connection finds
   ``cutting`` and waits. The listeners are drained (a PING answered after every earlier notification),
   the last changed keys copied, then the target's markers are made final and each source marker says
   ``done`` (a server of both layouts gets the target's marker with ``from``). Waiting clients then follow
   the store to the target and run their cut-off calls again (:mod:`zcluster._following`). The pause is
   measured and reported (``MigrationReport.pause``).
5. **Clean up.** The keys that moved away from a server of both layouts are deleted there; the servers only
   of the source keep their data, under a marker that refuses every client and names the target.

One mover at a time (:mod:`zcluster.migration._fence`): :meth:`Migration.run` takes the migration's lease before
anything else and raises a fence on every server it will write to; each of its writes (copies, deletes, marker
writes) is a script that checks the fence on the server receiving it, so a mover taken over writes nothing more.

Exactly once: until the cut-over every write goes to the source only; at the cut-over no client writes and
every key changed since its copy is copied again, so the target holds every key exactly as the source did
(records, totals with their fences, checkpoints with producer states, dedup entries).

Resuming: the state is in the markers, so :meth:`Migration.run` after a mover was killed continues the same
migration. Changes made while no listener ran cannot be known, so the copy pass starts over (copies are
idempotent) after deleting from the target the keys the source no longer holds; a migration killed in its
cut-over before its first final write first goes back to ``copying`` (clients waiting go on with the source);
one killed among its final writes (every key was copied then) finishes them, then cleans up.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis

from zcluster._keys import KeyLayout
from zcluster._markers import marker_key
from zcluster._moves import public_url
from zcluster._scripts import fence_script
from zcluster._topology import ClusterTopology, Shard, StandaloneTopology, Topology
from zcluster._transport import Transport
from zcluster.config import ClusterConfig, Where
from zcluster.errors import ConfigError, LayoutMismatchError
from zcluster.migration._checks import check_parameters, checked_namespaces
from zcluster.migration._copier import CHUNK, EVENTS, Copier, Listener, notifying, restore, settings
from zcluster.migration._fence import Fence
from zcluster.migration._marking import Marking
from zcluster.migration.report import MigrationReport, Progress

log = logging.getLogger("zcluster")

STATE_NAMESPACES = ("zcstate:", "zcdedup:")
"""The state store's and dedup's default namespaces: moved with the store unless ``namespaces`` is given."""


class Migration(Marking):
    """Moves the standalone store at ``source`` to ``target`` (standalone shards routed by ``jump``, or a Redis
    Cluster seed ``redis+cluster://...``) while applications keep using it; see the module for the protocol.

    ``namespaces``: the key prefixes moved besides the store's own (default: ``zcstate:`` and ``zcdedup:``), a
    list of non-empty str; one can be narrower than a namespace, e.g. ``zcstate:<app>/`` (one application's
    checkpoints). A source holding keys laid out as zcluster's (``{...``) in no namespace and of no other
    store is refused before anything moves (a state store under another namespace would stay behind) unless
    ``keep_others``: then they stay. The state namespaces do not say which store a key is of: when the source
    servers also hold another store (its layout marker, or, kept by ``keep_others``, keys laid out as a
    store's), moving a namespace besides the prefix is refused unless ``own_namespaces`` (the operator states
    they hold this store's keys only; see the README's "Growing the store" for the ways forward); a namespace
    that is, or nests in, another store's prefix is always refused. ``rate``: at most this many keys scanned
    per second (None: as fast as the servers go). ``batch``: keys per SCAN step and copy (1 or more).
    ``cutover_keys``: the cut-over starts once a catch-up round finds at most this many changed keys (0 or
    more). ``progress`` is called after each batch. ``connection``: redis-py options for every server
    (credentials come with the URLs). ``lease``: seconds without a heartbeat after which this mover's lease may
    be taken by another run; ``take_over``: take the lease from a live holder (see
    :mod:`zcluster.migration._fence`: one mover at a time, and a mover taken over writes nothing more).

    Followers reconnect to the target with their own credentials (the source URL's user-info, query options
    and TLS, on the target's public URL): before anything moves, each target server must accept a connection
    built that way from the first source URL (authenticate, be the database the mover writes to, run a script
    on the marker's key), else :class:`ConfigError` names it. The check can only use the source URLs the
    mover is given: give it the URLs (credentials) the applications use.

    Needs on each source server: ``CONFIG SET`` (keyspace notifications, restored at the end), ``CLIENT
    KILL``, ``PSUBSCRIBE``, ``DUMP``; on the target: ``RESTORE``. The servers of both layouts must run the
    same Redis (or a newer one on the target: ``RESTORE`` refuses a newer RDB version).

    Errors: a bad parameter (``namespaces``, ``rate``, ``batch``, ``cutover_keys``, ``retry_for``: a finite
    number of seconds, 0 or more) raises :class:`ConfigError` naming it and its value at construction, before
    any connection. A bad layout (shared server at another place, a target server holding another store or
    keys of the namespaces, another prefix or ``max_size``, a roshi-routed store, another store's state
    possibly in the namespaces, a target refusing followers) raises :class:`ConfigError` or
    :class:`LayoutMismatchError` before anything moves. A server that fails mid-way raises its error after
    the mover retried for ``retry_for`` seconds; nothing is lost: run again to resume.
    """

    def __init__(
        self,
        source: Where,
        target: Where,
        *,
        prefix: str | None = None,
        max_size: int | None = None,
        namespaces: Sequence[str] | None = None,
        rate: float | None = None,
        batch: int = 2000,
        cutover_keys: int = 2000,
        connection: dict[str, Any] | None = None,
        progress: Callable[[Progress], None] | None = None,
        retry_for: float = 60.0,
        keep_others: bool = False,
        lease: float = 30.0,
        take_over: bool = False,
        own_namespaces: bool = False,
    ) -> None:
        namespaces = checked_namespaces(namespaces)
        check_parameters(rate=rate, batch=batch, cutover_keys=cutover_keys, retry_for=retry_for, lease=lease)
        layout: dict[str, Any] = {k: v for k, v in (("prefix", prefix), ("max_size", max_size)) if v is not None}
        self.source = ClusterConfig.of(source, **layout)
        self.target = ClusterConfig.of(target, **layout)
        if self.source.cluster_url:
            raise ConfigError(
                "the source is a Redis Cluster: it grows and shrinks by resharding (redis-cli --cluster add-node "
                "and reshard), which clients follow; see the README's 'Growing the store'"
            )
        if self.source.routing != "jump" or self.target.routing != "jump":
            raise ConfigError("a roshi-routed store cannot be migrated online: migration moves keys by hash slot")
        if (self.source.prefix, self.source.max_size) != (self.target.prefix, self.target.max_size):
            raise LayoutMismatchError(
                f"source and target differ in prefix or max_size ({self.source.prefix!r}, {self.source.max_size} "
                f"vs {self.target.prefix!r}, {self.target.max_size}): a migration keeps the store as it is"
            )
        self.layout = KeyLayout(self.source.prefix)
        self.key = marker_key(self.layout)
        self.namespaces = list(
            dict.fromkeys([self.source.prefix, *(STATE_NAMESPACES if namespaces is None else namespaces)])
        )
        for ns in self.namespaces:
            KeyLayout(ns)  # validates
        self.rate, self.batch, self.cutover_keys = rate, batch, cutover_keys
        self.progress, self.retry_for = progress, retry_for
        self.connection = dict(connection or {})
        self.src: StandaloneTopology = StandaloneTopology(list(self.source.urls), "jump", **self.connection)
        self.dst: Topology = (
            ClusterTopology(self.target.cluster_url, 0.0, **self.connection)
            if self.target.cluster_url
            else StandaloneTopology(list(self.target.urls), "jump", **self.connection)
        )
        self.out = Transport(self.dst, (fence_script(),), CHUNK)
        self.take_over = take_over
        self.fence = Fence(self.layout.prefix, self.src.shards[0], lease, self._retrying, repr(self.source.prefix))
        self.copier = Copier(self.src, self.out, batch, self.fence)
        self.urls = [public_url(u) for u in (self.target.urls or (self.target.cluster_url or "",))]
        self._seen: list[dict[str, Any]] = []
        self._notify: list[str] = []
        self.others: list[bytes] = []  # zcluster-looking keys of no namespace seen by the scans
        self.keep_others, self.own_namespaces = keep_others, own_namespaces

    # -- the whole run ------------------------------------------------------------------------------------

    def run(self) -> MigrationReport:
        """Run (or resume) the migration to its end; see the module. Returns what it did.

        Raises :class:`zcluster.MigrationFencedError` before doing anything while another mover holds the
        migration's lease, and as soon as this mover finds its lease taken over (see
        :mod:`zcluster.migration._fence`)."""
        started = time.monotonic()
        self._source_markers()  # the checks first, reads only: a refused run leaves nothing, not even a lease
        checked, _ = self._under_way()
        if checked is not None:
            self._check_resume(checked)
        else:
            self._check_target()
        self.fence.acquire(self.take_over)
        self.fence.start()
        try:
            return self._run(started, checked is None)
        finally:
            self.fence.release()

    def _run(self, started: float, checked: bool) -> MigrationReport:
        """The run under the lease: the markers read again (another mover may have moved them before this one
        took the lease); ``checked``: the target was checked for a new migration."""
        raw = self._source_markers()
        move, finishing = self._under_way()
        resumed = None
        if move is not None:
            resumed = str(move.get("state"))
            self._check_resume(move)
            mig, target_id = str(move["id"]), str(move["to"]["id"])
        else:
            if not checked:  # the migration ended between the checks and the lease: a new one is checked anew
                self._check_target()
            mig, target_id = uuid.uuid4().hex, uuid.uuid4().hex
        known = move.get("notify") if isinstance(move, dict) else None
        self._notify = list(known) if isinstance(known, list) else [settings(self._on(s)) for s in self.src.shards]
        report = MigrationReport(mig, target_id, resumed_from=resumed, urls=list(self.urls))
        self.fence.raise_fences(*self._fenced_servers())  # every check above only read: the first write is next
        if finishing or resumed == "done":
            self._check_kept(target_id)
        if finishing:  # killed among the cut-over's last writes: its copy was complete, those writes are finished
            began = time.monotonic()
            self._finalize(raw, mig, target_id)
            report.pause = time.monotonic() - began
            log.warning(
                "migration %s: its cut-over to [%s] finished (the mover was killed in it)", mig, ", ".join(self.urls)
            )
            self._notifications_off()
        elif resumed != "done":
            self._mark_target(mig, target_id)  # again when resumed: a target restarted empty meanwhile
            raw = self._set_state(raw, mig, target_id, "copying", from_state=resumed)
            self._copy_and_cut(report, raw, resumed is not None)
        else:  # a mover killed after its cut-over may have left them on; a later setting of the server's stays
            self._notifications_off(left_on=True)
        self._clean_up(report)
        self.fence.drop(*self._fenced_servers())
        report.seconds = time.monotonic() - started
        self._report(Progress("done", report.scanned, report.copied, report.deleted))
        log.info("migration %s: done in %.1f s (pause %.3f s)", mig, report.seconds, report.pause)
        return report

    def _fenced_servers(self) -> tuple[list[Shard], ClusterTopology | None]:
        """The standalone servers the mover writes to (source and target, each once), and a Redis Cluster
        target (fenced per slot)."""
        servers = {s.name: s for s in self.src.shards}
        if isinstance(self.dst, ClusterTopology):
            return list(servers.values()), self.dst
        for shard in self.dst.shards:
            servers.setdefault(shard.name, shard)
        return list(servers.values()), None

    def _copy_and_cut(self, report: MigrationReport, raw: list[bytes], resumed: bool) -> None:
        listeners: list[Listener] = self._retrying(self._listen)
        try:
            if resumed:
                self.copier.deleted += self._reconcile()  # counted with the pass's deletes (it sets the report)
            while True:
                self.fence.check()
                report.passes += 1
                self._pass(report)
                report.rounds += self._catch_up(listeners, report)
                if self._deaf(listeners):  # a source server restarted, or its link was cut
                    log.warning("migration: a keyspace listener may have missed changes: copying every key again")
                    for listener in listeners:
                        listener.close()
                    listeners = self._retrying(self._listen)
                elif not self._target_lost(report) and self._cut_over(report, raw, listeners):
                    break
        finally:
            for listener in listeners:
                listener.close()
            self._notifications_off()

    # -- copying ------------------------------------------------------------------------------------------

    def _pass(self, report: MigrationReport) -> None:
        total = sum(int(self._call(s, "DBSIZE")) for s in self.src.shards) or 1
        self.others = []
        started, scanned = time.monotonic(), 0
        for i, shard in enumerate(self.src.shards):
            for keys in self._scan(shard):
                moving = self.copier.moving(i, keys)
                self._retrying(functools.partial(self.copier.copy, i, moving))
                scanned += len(keys)
                self._pace(scanned, started)
                rate = scanned / max(time.monotonic() - started, 1e-9)
                eta = max(total - scanned, 0) / rate if rate else None
                done = report.scanned + scanned
                self._report(Progress("copying", done, self.copier.copied, self.copier.deleted, rate, eta))
        report.scanned += scanned
        report.copied, report.deleted = self.copier.copied, self.copier.deleted
        report.others, self.others = len(self.others), []
        if report.others:
            log.warning("migration: %d key(s) of no namespace %s stay where they are", report.others, self.namespaces)

    def _catch_up(self, listeners: list[Listener], report: MigrationReport) -> int:
        """Rounds copying the keys changed since their copy, until one finds at most ``cutover_keys``, or stops
        shrinking (writers change the moving keys about as fast as they are copied: more rounds would only
        lengthen the migration, the cut-over copies what is left), or after 20."""
        rounds, before = 0, None
        while rounds < 20:
            rounds += 1
            changed = sum(self._copy_changed(i, listener) for i, listener in enumerate(listeners))
            self._report(Progress("catching up", report.scanned, self.copier.copied, self.copier.deleted))
            if changed <= self.cutover_keys or any(listener.lost for listener in listeners):
                break
            if before is not None and changed > 0.8 * before:
                log.warning("migration: %d key(s) changed in the last catch-up round: cutting over now", changed)
                break
            before = changed
        report.copied, report.deleted = self.copier.copied, self.copier.deleted
        return rounds

    def _copy_changed(self, i: int, listener: Listener) -> int:
        keys = self.copier.moving(i, (k for k in listener.take() if k != self.key))
        self._retrying(functools.partial(self.copier.copy, i, keys))
        return len(keys)

    def _listen(self) -> list[Listener]:
        self._notifications_on()  # again: a server restarted meanwhile forgot them
        return [Listener(shard, self.namespaces) for shard in self.src.shards]

    def _deaf(self, listeners: list[Listener]) -> bool:
        """Whether a listener may have missed changes: its subscription was cut, or its server no longer
        publishes them (restarted: ``notify-keyspace-events`` is not persisted)."""
        publishing = [notifying(settings(self._on(shard))) for shard in self.src.shards]
        return any(listener.lost for listener in listeners) or not all(publishing)

    def _target_lost(self, report: MigrationReport) -> bool:
        """Whether a target server lost what was copied to it (restarted empty: its marker is gone); marked
        again then, and the pass runs again."""
        lost = self._unmarked(report.target_layout)
        if lost:
            log.warning("migration: target %s lost its data (restarted empty?): copying every key again", lost)
            self._mark_target(report.migration, report.target_layout)
        return bool(lost)

    def _unmarked(self, target_id: str) -> list[str]:
        """The target servers only of the target whose marker is gone (restarted empty)."""
        return [s.name for s, _ in self._target_markers(target_id, {}, True) if not self._call(s, "EXISTS", self.key)]

    def _check_kept(self, target_id: str) -> None:
        """Refuse to go on after a cut-over whose final writes began (a resumed mover) when a server only of the
        target has lost its marker since: it restarted empty, and the keys copied there, and any written there
        since, are gone from it. Writing its marker again would hide that; cleaning up would delete the
        source's last copies of the keys that moved there."""
        lost = self._unmarked(target_id)
        if lost:
            raise LayoutMismatchError(
                f"target {', '.join(lost)} holds no layout marker, though the cut-over to it began: restarted "
                "empty? Nothing more was done: the source servers still hold their copies of the keys that moved "
                "there (no clean-up ran). Restore that server's data before running the migration again"
            )

    def _reconcile(self) -> int:
        """After a resume: delete from the target the copies whose key the source no longer holds."""
        removed = 0
        src_names = self.names(self.src)
        for shard in self.dst.masters():
            for keys in self._scan(shard):
                by_owner: dict[int, list[bytes]] = {}
                for key in keys:
                    owner = self.copier.owner(key)
                    if src_names[owner] != shard.name:  # a copy (the source holds it elsewhere)
                        by_owner.setdefault(owner, []).append(key)
                gone = []
                for owner, copies in by_owner.items():
                    held = self._each(self.src.shards[owner], "EXISTS", copies)
                    gone += [key for key, n in zip(copies, held, strict=True) if not n]
                self._delete(shard, self.dst, gone)
                removed += len(gone)
        return removed

    # -- the cut-over -------------------------------------------------------------------------------------

    def _cut_over(self, report: MigrationReport, raw: list[bytes], listeners: list[Listener]) -> bool:
        """The cut-over (see the module); False when it had to let the clients go on with the source (a server
        restarted in its last moments), so that the copy runs again."""
        move = json.loads(raw[0])["move"]
        mig, target_id = move["id"], move["to"]["id"]
        began = time.monotonic()
        cutting = self._set_state(raw, mig, target_id, "cutting", from_state="copying")
        try:
            final = self._last_copy(mig, listeners)
            again = self._deaf(listeners) or self._target_lost(report)  # a server restarted in the last moments
        except BaseException:
            self._set_state(cutting, mig, target_id, "copying", from_state=None)  # the clients go on; run again
            raise
        if again:
            self._set_state(cutting, mig, target_id, "copying", from_state=None)  # the clients go on with the source
            log.warning("migration %s: a server restarted during the cut-over: copying again", mig)
            return False
        self._finalize(cutting, mig, target_id)
        report.pause = time.monotonic() - began
        report.final_keys = final
        report.copied, report.deleted = self.copier.copied, self.copier.deleted
        log.warning("migration %s: cut over to [%s]: clients paused %.3f s", mig, ", ".join(self.urls), report.pause)
        return True

    def _finalize(self, raw: list[bytes], mig: str, target_id: str) -> None:
        """The cut-over's last writes, once every key is copied: the target's markers made final (its own
        shards first: a client that sees the move on a shared one connects to them next), then each marker
        of a shard only of the source set to ``done``. A marker already final is left as it is, so that a
        mover killed among these writes finishes them when run again. ``from`` names the source and keeps
        what a resumed mover needs when every source shard already holds the target's marker."""
        names = self.names(self.src)
        origin = {"id": self.source_id, "shards": names, "migration": mig, "notify": self._notify}
        markers = self._target_markers(target_id, {"from": origin}, only_new=False)
        for shard, value in sorted(markers, key=lambda sv: sv[0].name in names):
            if shard.name not in names:
                self._set(shard, value)
            elif not self._final(json.loads(raw[names.index(shard.name)])):
                self._cas(shard, raw[names.index(shard.name)], value)
        kept = {s.name for s, _ in markers}
        for i, shard in enumerate(self.src.shards):
            marker = json.loads(raw[i])
            if shard.name not in kept and marker["move"]["state"] != "done":
                self._cas(shard, raw[i], json.dumps(marker | {"move": marker["move"] | {"state": "done"}}))

    def _last_copy(self, mig: str, listeners: list[Listener]) -> int:
        """Cut every client off the source, then copy the last changed keys; how many."""
        for shard in self.src.shards:
            self._call(shard, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        final = 0
        for attempt in range(3):  # once the kill ran no client writes: a second drain finds nothing new
            for listener in listeners:  # every PING on its way before any is waited for
                listener.ping()
            for listener in listeners:
                listener.drain()
            changed = sum(self._copy_changed(i, listener) for i, listener in enumerate(listeners))
            final += changed
            if attempt and changed:
                log.warning("migration %s: %d key(s) changed after the clients were cut off", mig, changed)
            if attempt and not changed:
                break
        return final

    def _clean_up(self, report: MigrationReport) -> None:
        """Delete, on the servers of both layouts, the keys that moved away from them."""
        self._report(Progress("cleaning", report.scanned, report.copied, report.deleted))
        removed = 0
        dst_names = {s.name for s in self.dst.masters()}
        for shard in self.src.shards:
            if shard.name not in dst_names:
                continue
            for keys in self._scan(shard):
                away = [k for k in keys if self.dst.shards[self.copier.destination(k)].name != shard.name]
                self._delete(shard, self.src, away)
                removed += len(away)
        report.removed = removed

    # -- plumbing -----------------------------------------------------------------------------------------

    def _notifications_on(self) -> None:
        for shard, before in zip(self.src.shards, self._notify, strict=True):
            self._call(shard, "CONFIG", "SET", "notify-keyspace-events", before + EVENTS)

    def _notifications_off(self, left_on: bool = False) -> None:
        """Each source server's ``notify-keyspace-events`` back as the migration found it; with ``left_on``,
        only where it still publishes what the listener needed and did not before (the mover's setting: a
        migration finished long ago, run again, leaves a setting made since alone)."""
        try:  # a mover taken over leaves them to the one holding the lease (CONFIG SET cannot be fenced)
            held = self.fence.beat()
        except redis.RedisError:
            held = not self.fence.lost.is_set()
        if not held:
            log.warning("migration: this mover lost its lease: notification settings left to the mover holding it")
            return
        for shard, before in zip(self.src.shards, self._notify, strict=True):
            if not left_on or (notifying(settings(self._on(shard))) and not notifying(before)):
                restore(shard.name, self._on(shard), before)

    def _pace(self, scanned: int, started: float) -> None:
        if self.rate:
            ahead = scanned / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)

    def _report(self, progress: Progress) -> None:
        if self.progress is not None:
            self.progress(progress)

    def close(self) -> None:
        self.out.close()
        self.src.close()

    def __enter__(self) -> Migration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
