"""The health of the locks in this process, for a health endpoint or ``manage.py locks doctor``.

    from django_rlock import health
    health.status()            # {"ok": True, "problems": [], "redis": [...], ...}

``status()`` checks what can break under a running process: Redis reachable and taking
writes (a write pause or a replica answers PING while every lock call hangs or fails); the watchdog
thread alive and every renewed hold's last confirmed renewal younger than a third of its
lease (plus half a period's grace); the pub/sub connection up; replicas acknowledging within
``RLOCK["SYNC_TIMEOUT"]`` where replica sync is on; the holds in doubt (``is_lost()`` true).
``doctor()`` adds the server settings that break locks (``engine.doctor``), each with its
fix. Neither raises for a server that is down: it is reported.
"""

from __future__ import annotations

from typing import Any

from .conf import get_config
from .connection import cache_alias, client_of, get_prefix
from .engine import doctor as engine_doctor
from .engine import health as engine_health


def status(cache: str | None = None) -> dict[str, Any]:
    """``engine.health.status`` for the locks of ``cache`` (default: ``RLOCK["CACHE"]``, or
    ``RLOCK["REDIS_URL"]``), with the replica-sync settings; ``cache`` names the alias."""
    alias = cache_alias(cache)
    config = get_config()
    out = engine_health.status(client_of(alias), sync_replicas=config["SYNC_REPLICAS"],
                               sync_timeout=float(config["SYNC_TIMEOUT"]),
                               prefix=get_prefix(alias))
    return {"cache": alias, **out}


def doctor(cache: str | None = None) -> dict[str, Any]:
    """``status()`` plus ``findings``: the server's settings that break locks (``level``
    ``error`` or ``warning``, ``problem``, ``fix``). ``ok`` is false on a problem of the
    status or an ``error`` finding."""
    out = status(cache)
    found = engine_doctor.findings(client_of(out["cache"]),
                                   float(get_config()["WATCHDOG_TIMEOUT"]))
    out["findings"] = found
    out["ok"] = out["ok"] and not any(f["level"] == "error" for f in found)
    return out


def doctor_lines(report: dict[str, Any], style: Any = None) -> list[str]:
    """``doctor()``'s report as the lines ``manage.py locks doctor`` prints."""
    def mark(ok: bool) -> str:
        word = "OK  " if ok else "FAIL"
        if style is None:
            return word
        return style.SUCCESS(word) if ok else style.ERROR(word)

    lines = [f"Locks on cache {report['cache']!r}:"]
    for s in report["redis"]:
        if s["reachable"]:
            detail = (f"reachable, {s['latency_ms']:g} ms, Redis {s.get('version', '?')}, "
                      f"{s.get('role', '?')}")
        else:
            detail = f"unreachable: {s.get('error', '?')}"
        lines.append(f"  {mark(s['reachable'])} redis     {s['server']}: {detail}")
        w = s.get("writes")
        if w is not None:
            detail = "taken" if w["ok"] else f"HELD OR REFUSED: {w.get('error', '?')}"
            lines.append(f"  {mark(w['ok'])} writes    {detail}")
        r = s.get("replicas")
        if r is not None:
            detail = (f"{r['acknowledged']} of {r['needed']} needed acknowledged within "
                      f"{r['timeout_s']:g} s ({r['online']} online)" if r.get("sync")
                      else f"replica sync off here ({r['online']} online)")
            lines.append(f"  {mark(r['ok'])} replicas  {detail}")
    for p in report["pubsub"]:
        detail = ("not started (no waiter yet)" if not p["started"] else
                  f"{'connected' if p['connected'] else 'DOWN'}, {p['reconnects']} reconnect(s)")
        lines.append(f"  {mark(p['ok'])} pub/sub   {detail}")
    w = report["watchdog"]
    thread = {None: "not started (nothing renewed yet)", True: "thread alive",
              False: "thread DEAD"}[w["thread_alive"]]
    detail = f"{thread}, {w['renewed_holds']} hold(s) renewed"
    if w["limit_s"] is not None:
        detail += f", oldest renewal {w['oldest_renewal_s']:g} s ago (limit {w['limit_s']:g} s)"
    detail += f", {w['late_renewals']} late since start"
    lines.append(f"  {mark(w['ok'])} watchdog  {detail}")
    h = report["holds"]
    lines.append(f"  {mark(h['ok'])} holds     {h['held']} held, {h['in_doubt']} in doubt, "
                 f"{h['lost']} lost (remembered for is_lost())")
    found = report.get("findings", [])
    lines.append("Server settings:" + ("" if found else " nothing found that breaks locks."))
    for f in found:
        level = f["level"].upper()
        if style is not None:
            level = style.ERROR(level) if f["level"] == "error" else style.WARNING(level)
        lines.append(f"  {level} {f['check']} ({f['server']}): {f['problem']}")
        lines.append(f"        fix: {f['fix']}")
    problems = report["problems"] + [f"{f['check']}: see above" for f in found
                                     if f["level"] == "error"]
    lines.append(f"{len(problems)} problem(s)." if problems else "All good.")
    return lines
