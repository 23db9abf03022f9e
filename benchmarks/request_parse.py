"""What checking a request body costs the backend: ``json_limits.loads`` (the hostile-input
parse) and ``parse_generation`` (the pydantic schema), per body, on this CPU, beside each
other. No server: the two functions on their own, best of five runs.

    python -m benchmarks.request_parse --json docs/benchmarks/request_parse.json
"""
from __future__ import annotations

import argparse
import json
import timeit
from functools import partial

from backend.server import json_limits
from backend.server.protocol import parse_generation
from benchmarks.backend_target import MODEL, machine, write_result

BODIES = {
    "chat, 2 messages, typical fields": ("chat", {
        "model": MODEL, "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France? " * 20}],
        "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "stream": True,
        "stream_options": {"include_usage": True}, "seed": 1, "stop": ["\n\n"]}),
    "chat, 40 messages": ("chat", {
        "model": MODEL, "max_tokens": 16, "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 30}
            for i in range(40)]}),
    "completion, 512 token ids": ("completion", {
        "model": MODEL, "prompt": list(range(512)), "max_tokens": 16, "ignore_eos": True}),
}


def _best_us(fn, number: int) -> float:
    return round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 2)


def measure(number: int) -> dict:
    rows = []
    for name, (kind, body) in BODIES.items():
        raw = json.dumps(body).encode()
        parsed = json_limits.loads(raw)
        rows.append({"body": name, "bytes": len(raw),
                     "json_limits_loads_us": _best_us(partial(json_limits.loads, raw), number),
                     "parse_generation_us": _best_us(partial(parse_generation, parsed, kind),
                                                     number)})
    return {"machine": machine(), "number": number, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=5000, help="calls per timing run")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    result = measure(args.number)
    write_result(args.json, result)
    print(f"{'body':34} {'bytes':>6} {'json_limits us':>15} {'schema us':>10}")
    for r in result["rows"]:
        print(f"{r['body']:34} {r['bytes']:>6} {r['json_limits_loads_us']:>15} "
              f"{r['parse_generation_us']:>10}")


if __name__ == "__main__":
    main()
