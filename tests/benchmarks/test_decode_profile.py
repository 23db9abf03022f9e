"""benchmarks.decode_profile on the CPU engine (synthetic tiny model, tiny counts)."""
import json

import pytest

from benchmarks.decode_profile import main


@pytest.mark.parametrize("overlap", [True, False])
def test_baseline_steps_with_and_without_overlap_scheduling(tmp_path, capsys, overlap):
    """With overlap scheduling a step's statistics arrive one step late, so none exist
    after the first step: the run must wait for them, not fail."""
    flag = "--async-scheduling" if overlap else "--no-async-scheduling"
    assert main(["--model", "synthetic:tiny", "--device", "cpu", "--batch", "1", "3",
                 "--prompt-tokens", "12", "--warmup", "2", "--baseline", "3", "--steps", "0",
                 "--weights-dtype", "int8", flag, "--out", str(tmp_path)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()
             if x.startswith("{")]
    assert [r["batch_size"] for r in lines] == [1, 3]
    for r in lines:
        assert r["baseline_only"] and r["step_ms_mean"] > 0 and r["weights"] == "int8"


def test_a_batch_that_finishes_while_measured_is_an_error(tmp_path):
    """Four tokens fit the context: the requests end during the baseline, whose step times
    would then be those of a smaller batch."""
    with pytest.raises(RuntimeError, match="shrank"):
        main(["--model", "synthetic:tiny", "--device", "cpu", "--batch", "2",
              "--prompt-tokens", "12", "--max-model-len", "16", "--warmup", "1",
              "--baseline", "5", "--steps", "0", "--out", str(tmp_path)])
