"""nsys_profile.sh / ncu_attention.sh plumbing, and the fixed-input replay.

Neither nsys nor ncu exists on CI, so stand-ins on PATH record the arguments they get and
answer with the CSV fixtures (hand-made to the tools' documented formats); the scripts'
own logic (the capture flags, the capture range, file names, summarize.py) is real.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NSIGHT = ROOT / "deploy" / "nsight"
FIX = Path(__file__).resolve().parent / "fixtures"

FAKE_NSYS = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
cmd=$1; shift
out=""
while [ $# -gt 0 ]; do
  case "$1" in --output=*) out="${1#--output=}" ;; --output) out="$2"; shift ;; esac
  shift
done
if [ "$cmd" = profile ]; then touch "$out.nsys-rep"; exit 0; fi
for r in cuda_gpu_kern_sum cuda_gpu_mem_time_sum cuda_gpu_trace; do
  cp "$FAKE_FIX/unhealthy_$r.csv" "${out}_$r.csv"
done
"""

FAKE_NCU = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
if [ "$1" = --import ]; then cat "$FAKE_FIX/ncu_details_handmade.csv"; exit 0; fi
if [ -n "${FAKE_DENY:-}" ]; then
  echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
  exit 1
fi
while [ $# -gt 0 ]; do [ "$1" = -o ] && { touch "$2.ncu-rep"; exit 0; }; shift; done
exit 3
"""


@pytest.fixture()
def fake_tools(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("nsys", FAKE_NSYS), ("ncu", FAKE_NCU)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "log"),
               FAKE_FIX=str(FIX), OUT_DIR=str(tmp_path / "out"), PYTHON=sys.executable)
    return env, tmp_path


def run(script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(NSIGHT / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_nsys_profile_uses_the_capture_range_and_summarizes(fake_tools):
    env, tmp = fake_tools
    proc = run("nsys_profile.sh", env)
    assert proc.returncode == 0, proc.stderr
    profile, stats = (tmp / "log").read_text().splitlines()
    args = shlex.split(profile)
    assert args[0] == "profile"
    for flag in ("--trace=cuda,nvtx,osrt,cublas,cudnn", "--capture-range=nvtx",
                 "--nvtx-capture=infer:replay", "--capture-range-end=stop",
                 "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0", "--force-overwrite=true",
                 f"--output={tmp}/out/infer_profile"):
        assert flag in args, (flag, args)
    # The default target: the fixed-input replay on the GPU with the same NVTX prefix.
    target = args[args.index(f"--output={tmp}/out/infer_profile") + 2:]
    assert target[0] == sys.executable and target[1].endswith("deploy/nsight/replay.py")
    assert target[2:] == ["--nvtx-prefix", "infer", "--device", "cuda"]
    assert "--report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_trace --format csv" in stats
    summary = json.loads((tmp / "out" / "infer_profile_summary.json").read_text())
    assert summary["nsys"]["gap_ratio"] == pytest.approx(12_000 / 103_000)
    assert "FAIL  kernel gap ratio" in proc.stdout


def test_nsys_profile_custom_prefix_and_command(fake_tools):
    env, tmp = fake_tools
    env.update(NVTX_PREFIX="bench", DURATION="10")
    proc = run("nsys_profile.sh", env, "--", "python", "my_replay.py", "--flag")
    assert proc.returncode == 0, proc.stderr
    args = shlex.split((tmp / "log").read_text().splitlines()[0])
    assert "--nvtx-capture=bench:replay" in args and "--duration=10" in args
    assert args[-3:] == ["python", "my_replay.py", "--flag"]


def test_ncu_attention_runs_the_article_command_and_summarizes(fake_tools):
    env, tmp = fake_tools
    proc = run("ncu_attention.sh", env)
    assert proc.returncode == 0, proc.stderr
    profile, export = (tmp / "log").read_text().splitlines()
    args = shlex.split(profile)
    i = args.index("--kernel-name")
    assert args[i + 1] == "regex:attention|flash"
    for flag, value in (("--launch-skip", "5"), ("--launch-count", "10"), ("--set", "full"),
                        ("-o", f"{tmp}/out/attention_profile")):
        assert args[args.index(flag) + 1] == value
    assert args[-5].endswith("deploy/nsight/replay.py")
    assert args[-4:] == ["--device", "cuda", "--kv-cache-memory", "2"]
    assert shlex.split(export) == ["--import", f"{tmp}/out/attention_profile.ncu-rep", "--csv",
                                   "--page", "details"]
    details = tmp / "out" / "attention_profile_details.csv"
    assert details.read_text() == (FIX / "ncu_details_handmade.csv").read_text()
    summary = json.loads((tmp / "out" / "attention_profile_summary.json").read_text())
    assert {k["name"] for k in summary["ncu"]} == {"paged_attention_decode_kernel",
                                                   "flash_fwd_kernel"}


def test_ncu_without_counter_access_says_how_to_fix_it(fake_tools):
    env, tmp = fake_tools
    env["FAKE_DENY"] = "1"
    proc = run("ncu_attention.sh", env, "--", "python", "x.py")
    assert proc.returncode == 1
    assert "SYS_ADMIN" in proc.stderr and "NVreg_RestrictProfilingToAdminUsers=0" in proc.stderr


def test_missing_tools_exit_127(tmp_path):
    env = dict(os.environ, NSYS=str(tmp_path / "none"), NCU=str(tmp_path / "none"),
               OUT_DIR=str(tmp_path))
    assert run("nsys_profile.sh", env).returncode == 127
    assert run("ncu_attention.sh", env).returncode == 127


def test_scripts_help_and_syntax():
    for script in ("nsys_profile.sh", "ncu_attention.sh", "ncu_kernels.sh"):
        assert subprocess.run(["bash", "-n", str(NSIGHT / script)], timeout=30).returncode == 0
        proc = run(script, dict(os.environ), "--help")
        assert proc.returncode == 0 and "deploy/nsight/" + script in proc.stdout
    for py in ("replay.py", "sdpa_probe.py", "summarize.py"):
        proc = subprocess.run([sys.executable, str(NSIGHT / py), "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "usage" in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("backend.engine.llm_engine") is None,
                    reason="the backend engine is not importable")
def test_replay_runs_fixed_inputs_through_the_engine_on_cpu(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_token_ids": [300, 301, 302, 303]}\n'
                       '{"prompt_token_ids": [310, 311, 312, 313, 314, 315]}\n')
    cmd = [sys.executable, str(NSIGHT / "replay.py"), "--model", "synthetic:tiny",
           "--device", "cpu", "--requests", "3", "--concurrency", "2", "--warmup", "1",
           "--output-tokens", "3", "--kv-cache-memory", "0.01", "--prompts", str(prompts)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # Warm-up takes prompt 0; the measured three cycle through the file: 6, 4, 6 tokens.
    assert out["requests"] == 3 and out["prompt_tokens"] == 16
    assert out["output_tokens"] == 9  # forced length: 3 tokens each, EOS ignored
    assert out["nvtx_capture_range"] == "infer:replay" and out["steps"] >= 3


def test_ncu_kernels_profiles_attention_and_matmuls_at_real_clocks(fake_tools):
    env, tmp = fake_tools
    proc = run("ncu_kernels.sh", env)
    assert proc.returncode == 0, proc.stderr
    args = shlex.split((tmp / "log").read_text().splitlines()[0])
    regex = args[args.index("--kernel-name") + 1]
    assert regex.startswith("regex:") and all(k in regex for k in ("attention", "gemm", "nvjet"))
    for flag, value in (("--clock-control", "none"), ("--set", "basic"),
                        ("--section", "MemoryWorkloadAnalysis"),
                        ("-o", f"{tmp}/out/kernel_table")):
        assert args[args.index(flag) + 1] == value
    target = args[args.index(sys.executable):]
    assert target[:3] == [sys.executable, "-m", "benchmarks.decode_profile"]
    assert "--steps" in target and target[target.index("--steps") + 1] == "0"
    assert (tmp / "out" / "kernel_table_summary.json").is_file()
    assert "FAIL  SM utilisation" in proc.stdout
