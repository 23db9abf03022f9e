"""TTFT decomposed per request, joined by ``x-request-id`` across the three records we have.

- client record (``loadtests.chat``): ``ttft_s`` measured at the load generator;
- gateway request log (JSONL, ``request_log`` in the gateway config): ``ttft_s`` from the
  gateway's receipt of the request to the first content relayed;
- backend ``firsttoken_timings`` (rides on the last streamed chunk, so the client record has
  it): ``queue_s``, ``prefill_s``, ``first_token_s`` from the backend's receipt.

Segments (seconds; they add up to the client TTFT exactly):
  client side     = client ttft - gateway ttft   (client->gateway network, client parsing)
  gateway         = gateway overhead_ttft_s      (the gateway's own work up to the first token)
  gateway->backend hop = gateway ttft - gateway own - backend first_token_s (network, connect)
  backend other   = first_token_s - queue_s - prefill_s  (tokenize, first sample/detokenize)
  backend queue   = queue_s
  prefill         = prefill_s
Without a gateway log, "client side" and "gateway" merge into "client + gateway"; without
backend timings (a cloud or foreign upstream), everything below the gateway is "upstream".
"""
from __future__ import annotations

import json
import math
import os

from loadtests.sse import RequestRecord

SEGMENTS = ("client side", "client + gateway", "gateway", "gateway->backend hop", "upstream",
            "backend other", "backend queue", "prefill")


def read_gateway_log(path: str | None) -> dict[str, dict]:
    """request_id -> gateway log entry (the last one wins); empty when there is no log."""
    if not path or not os.path.exists(path):
        return {}
    out: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue  # a line being written while we read
            if isinstance(d, dict) and d.get("request_id"):
                out[str(d["request_id"])] = d
    return out


def segments(rec: RequestRecord, gw: dict | None) -> dict[str, float] | None:
    """The TTFT split of one request; None when it has no client TTFT."""
    if not rec.ok or rec.ttft_s is None:
        return None
    gw_ttft = _f(gw, "ttft_s")
    bt = rec.server_timings or {}
    b_first = _f(bt, "first_token_s")
    out: dict[str, float] = {}
    if b_first is not None:
        queue, prefill = _f(bt, "queue_s") or 0.0, _f(bt, "prefill_s") or 0.0
        out["backend queue"], out["prefill"] = queue, prefill
        out["backend other"] = b_first - queue - prefill
    if gw_ttft is None:
        if b_first is None:
            out["upstream"] = rec.ttft_s
        else:
            out["client + gateway"] = rec.ttft_s - b_first
        return out
    own = _f(gw, "overhead_ttft_s") or 0.0
    out["client side"] = rec.ttft_s - gw_ttft
    out["gateway"] = own
    if b_first is None:
        out["upstream"] = gw_ttft - own
    else:
        out["gateway->backend hop"] = gw_ttft - own - b_first
    return out


def _f(d: dict | None, key: str) -> float | None:
    v = d.get(key) if d else None
    return None if v is None else float(v)


def decompose(records: list[RequestRecord], gateway_log: dict[str, dict]) -> dict:
    """Mean of each segment over measured requests (stack height = mean client TTFT)."""
    per: dict[str, list[float]] = {s: [] for s in SEGMENTS}
    joined_gw = joined_backend = n = 0
    for rec in records:
        if rec.phase != "measure":
            continue
        seg = segments(rec, gateway_log.get(rec.request_id))
        if seg is None:
            continue
        n += 1
        joined_gw += rec.request_id in gateway_log
        joined_backend += bool(rec.server_timings)
        for name in SEGMENTS:
            per[name].append(seg.get(name, 0.0))
    means = {name: (math.fsum(v) / len(v) if v else 0.0) for name, v in per.items()}
    return {"requests": n, "joined_gateway": joined_gw, "joined_backend": joined_backend,
            "mean_s": {k: v for k, v in means.items() if any(per[k])}}
