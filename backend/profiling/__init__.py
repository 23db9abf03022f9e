"""Where the time goes, measured by the tool itself.

``summary`` (the three numbers of where GPU time goes, and verdicts; standard library only, shared with
``deploy/nsight/summarize.py``), ``chrome_trace`` (reads torch.profiler traces), ``ranges``
(named ranges that cost nothing outside a capture), ``capture`` (profile the next N engine
steps), ``gpm`` (NVML GPU performance metrics: SM activity beside GPU-Util), ``report`` and
``timeline`` (a saved trace as text/JSON or as a PNG), ``decode_profile`` (the engine's decode
at fixed batch sizes, profiled). Nsight Compute's kernel table: deploy/nsight/ncu_kernels.sh.
Importing the package itself stays cheap (no torch).
"""
