"""Holds the figures `kvdrift run` writes to /drift/summary to the NumPy
reference model (qwen3next_ref.py).

usage: check_run.py CKPT_DIR RESULTS.h5 TRACES.h5

CKPT_DIR is `kvdrift export` output of the model the sweep ran, RESULTS.h5 a
drift sweep of one trace at one context over bf16, fp8-cal and fp8-unscaled,
TRACES.h5 that trace (`kvdrift trace gen` with the sweep's seed and length).

The reference computes the trace in float64 with each mode's cache (its own
BF16 rounding and E4M3 codec, fp8-cal with the scales the results file
recorded in /calibration), and the figures from their definitions, written
here from the documentation rather than from the C:
  - at position p (0 <= p < context - 1) the prediction of token p + 1:
    KL(P_bf16 || P_mode), whether the two argmaxes agree, delta p = p_mode -
    p_bf16 of the next token, delta NLL = NLL_mode - NLL_bf16;
  - kl_mean, the KL percentiles (linear interpolation between ranks),
    same_top_p, delta_p_rms, ln_ppl_ratio = mean delta NLL;
  - subsets: positions whose next token copies earlier content (the trace's
    references) and the rest.
The C computes in float32 and reads its own cache: a K or V value within
float32 noise of a rounding midpoint can round the other way, so the figures
are compared within tolerances (stated per figure below), not bit for bit.
"""
import json
import sys

import h5py
import numpy as np

from qwen3next_ref import Qwen3NextRef

MODES = ("fp8-cal", "fp8-unscaled")
# figure -> (relative tolerance, absolute tolerance)
# (measured on tiny, 512 tokens: within 3e-3 relative, top-1 identical)
TOL = {"kl_mean": (0.005, 1e-7), "kl_median": (0.02, 1e-7), "kl_p90": (0.02, 1e-7),
       "kl_p99": (0.02, 1e-6), "kl_max": (0.02, 1e-6), "ln_ppl_ratio": (0.02, 2e-5),
       "delta_p_rms": (0.01, 1e-7), "same_top_p": (0.0, 0.004)}


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def percentile(v, q):
    v = np.sort(v)
    x = q * (len(v) - 1)
    i = int(x)
    return v[i] + (x - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def figures(lp_ref, lp, nxt):
    p_ref = np.exp(lp_ref)
    kl = np.sum(p_ref * (lp_ref - lp), axis=-1)
    same = (np.argmax(lp_ref, -1) == np.argmax(lp, -1)).astype(np.float64)
    rows = np.arange(len(nxt))
    dp = np.exp(lp[rows, nxt]) - np.exp(lp_ref[rows, nxt])
    dnll = lp_ref[rows, nxt] - lp[rows, nxt]
    return {"kl_mean": kl.mean(), "kl_median": percentile(kl, 0.5), "kl_p90": percentile(kl, 0.9),
            "kl_p99": percentile(kl, 0.99), "kl_max": kl.max(), "same_top_p": same.mean(),
            "delta_p_rms": np.sqrt(np.mean(dp * dp)), "ln_ppl_ratio": dnll.mean()}


def main():
    ckpt, results, traces = sys.argv[1:4]
    failures, checks = [], 0

    def check(ok, what):
        nonlocal checks
        checks += 1
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with h5py.File(results, "r") as f:
        summ = f["drift/summary"][:]
        ks, vs = f["calibration/k_scale"][:], f["calibration/v_scale"][:]
    with h5py.File(traces, "r") as f:
        g = f["traces"][sorted(f["traces"])[0]]
        tokens = g["tokens"][:].astype(np.int64)
        refs = g["references"][:]
    ctx = int(summ["context"][0])
    check(set(summ["context"]) == {ctx} and set(summ["trace"]) == {0},
          f"{results}: one context ({ctx}) and one trace")
    copied = np.zeros(len(tokens), dtype=bool)
    copied[refs["pos"]] = True
    tok = tokens[:ctx]
    nxt = tok[1:]
    model = Qwen3NextRef(ckpt)
    kvh = model.cfg["num_key_value_heads"]
    scales = {"k": list(ks.reshape(-1, kvh)), "v": list(vs.reshape(-1, kvh))}
    lp_ref = log_softmax(model.forward(tok, "bf16")[0])[:-1]
    subsets = {"all": np.ones(ctx - 1, dtype=bool), "copy": copied[1:ctx], "other": ~copied[1:ctx]}
    print(f"context {ctx}: {int(subsets['copy'].sum())} of {ctx - 1} predictions are of copied tokens")
    for mode in MODES:
        logits, _ = model.forward(tok, mode, scales)
        lp = log_softmax(logits)[:-1]
        for sub, sel in subsets.items():
            want = figures(lp_ref[sel], lp[sel], nxt[sel])
            for name, (rel, ab) in TOL.items():
                row = summ[(summ["mode"] == mode.encode()) & (summ["subset"] == sub.encode()) &
                           (summ["metric"] == name.encode())]
                got = float(row["value"][0]) if len(row) == 1 else float("nan")
                ok = abs(got - want[name]) <= max(rel * abs(want[name]), ab)
                check(ok, f"{mode} {sub} {name}: kvdrift {got:.6g}, reference {want[name]:.6g}"
                          f" (within {rel:g} relative or {ab:g})")
    bf = summ[summ["mode"] == b"bf16"]
    check(len(bf) > 0 and all(float(r["value"]) == (1.0 if r["metric"] == b"same_top_p" else 0.0)
                              for r in bf if r["metric"] in [m.encode() for m in TOL]),
          "bf16 against itself: every figure exactly 0 (same_top_p 1)")
    print(f"run figures against the reference: {checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
