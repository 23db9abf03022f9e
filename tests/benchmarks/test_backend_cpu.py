"""benchmarks.backend_cpu --paired on a small setting: our server (spawned) beside a running
peer server (the real app, in this process), both on SmolLM2 (a model slow enough that a
stream's tokens arrive apart; the synthetic tiny one can deliver all of them in one read);
every repetition reaches both, and the summary holds one ratio per pair (no timing is
asserted)."""
import json

from benchmarks import backend_cpu
from tests.backend.server.conftest import real_server

MODEL = "smollm2-135m-instruct"


def test_paired_run_measures_both_sides_pair_by_pair(tmp_path):
    peer = real_server(MODEL, kv_cache_memory_gib=0.25, max_model_len=1024)
    out = tmp_path / "paired.json"
    try:
        assert backend_cpu.main([
            "--model", MODEL, "--peer-url", peer.base_url, "--paired",
            "--reps", "3", "--prompt-tokens", "24", "--decode-tokens", "8",
            "--concurrency", "2", "--out", str(out)]) == 0
    finally:
        peer.stop()
    doc = json.loads(out.read_text())
    assert "transformers" not in doc  # the peer takes transformers' place
    for side in ("backend", "peer"):
        for metric in ("ttft_s", "decode_tok_s", "aggregate_tok_s"):
            assert len(doc[side][metric]) == 3 and min(doc[side][metric]) > 0
    ratios = doc["summary"]["backend_over_peer"]
    assert set(ratios) == {"ttft_speedup", "decode_batch1", "aggregate_2"}
    for r in ratios.values():
        assert len(r["pairs"]) == 3 and r["median"] == sorted(r["pairs"])[1]
    assert doc["peer_first_request"]["completion_tokens"] == 16
