"""Holds the figures `kvdrift run` writes to /drift/summary to the NumPy
reference model (qwen3next_ref.py).

usage: check_run.py CKPT_DIR RESULTS.h5 TRACES.h5

CKPT_DIR is `kvdrift export` output of the model the sweep ran, RESULTS.h5 a
drift sweep of one trace at one context over bf16, fp8-cal and fp8-unscaled,
TRACES.h5 that trace (`kvdrift trace gen` with the sweep's seed and length).
Besides /drift/summary it checks /drift/layers (the residual stream after
every layer: relative L2 error and cosine against BF16, every position; the
share of positions whose routed expert set differs from BF16's) and
/drift/attention (per full-attention layer at the sampled positions: every
16th and each copy's first token; KL(P_ref || P_test) of the attention
distribution averaged over heads, agreement of the most-attended position,
relative L2 error of the attention output before the gate, and per KV head
the KL of its query heads (the sweep runs with --attn-per-head); the isolated view
is the reference's query over the reference's K and V through the mode's
codec, the propagated view the mode's own run against the reference's).

The reference computes the trace in float64 with each mode's cache (its own
BF16 rounding and E4M3 codec, fp8-cal with the scales the results file
recorded in /calibration), and the figures from their definitions, written
here from the documentation rather than from the C. A sweep run with
--attn-fp8 (its run_settings say so) has the E4M3 modes' attention in FP8:
the query through E4M3 with fp8-cal's /calibration/q_scale (1.0 for
fp8-unscaled), the weights 2^8 exp(s - max) rounded to E4M3 over the
unrounded weights' sum, in both views.
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

from checks import Checks, read_sweep
from qwen3next_ref import Qwen3NextRef, fp8_attention, store

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




def att_figures(p_ref, o_ref, p_test, o_test, pos, kv_heads):
    """Per sampled position: mean over heads of KL (each clamped at 0), and
    per KV head over its query heads; share of heads whose argmax agrees;
    output relative L2 over all heads."""
    pr, pt = p_ref[:, pos], p_test[:, pos]  # [heads, n, T]
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_h = np.maximum(np.where(pr > 0, pr * (np.log(pr) - np.log(pt)), 0).sum(-1), 0)
    kl = kl_h.mean(0)
    kl_kvh = kl_h.reshape(kv_heads, -1, len(pos)).mean(1)  # [kv_heads, n]
    agree = (pr.argmax(-1) == pt.argmax(-1)).mean(0)
    d = (o_test[pos] - o_ref[pos]).reshape(len(pos), -1)
    rel = np.linalg.norm(d, axis=-1) / np.linalg.norm(o_ref[pos].reshape(len(pos), -1), axis=-1)
    return {"kl": kl, "argmax_agree": agree, "out_rel_l2": rel, "kl_kvh": kl_kvh}


def file_mean(rows):
    """The n-weighted mean of a figure's rows over the position buckets, and n."""
    n = rows["n"].sum()
    return (float((rows["n"] * rows["mean"]).sum() / n) if n else float("nan")), int(n)


def main():
    ckpt, results, traces = sys.argv[1:4]
    check = Checks()

    model = Qwen3NextRef(ckpt)
    kvh = model.cfg["num_key_value_heads"]
    t, scales, tokens, refs = read_sweep(results, traces, ("drift/summary", "drift/layers", "drift/attention"), kvh)
    # FP8 attention (run --attn-fp8): the E4M3 modes' query and weights in
    # E4M3, fp8-cal's query scales those /calibration/q_scale recorded
    with h5py.File(results, "r") as f:
        attn_fp8 = bool(json.loads(f.attrs["run_settings"]).get("attn-fp8", False))
        if attn_fp8:
            scales["q"] = list(f["calibration/q_scale"][:])
    nh = model.cfg["num_attention_heads"]
    print(f"FP8 attention: {'on' if attn_fp8 else 'off'}")
    summ, layers, att = t["drift/summary"], t["drift/layers"], t["drift/attention"]
    ctx = int(summ["context"][0])
    check(set(summ["context"]) == {ctx} and set(summ["trace"]) == {0},
          f"{results}: one context ({ctx}) and one trace")
    copied = np.zeros(len(tokens), dtype=bool)
    copied[refs["pos"]] = True
    # a copy's first token: not the continuation of the previous reference
    first = np.zeros(len(tokens), dtype=bool)
    for i, (p, src) in enumerate(zip(refs["pos"], refs["src"])):
        first[p] = not (i > 0 and refs["pos"][i - 1] == p - 1 and refs["src"][i - 1] == src - 1)
    tok = tokens[:ctx]
    nxt = tok[1:]
    model.record = rec_ref = {}
    lp_ref = log_softmax(model.forward(tok, "bf16")[0])[:-1]
    sampled = np.nonzero((np.arange(ctx) % 16 == 0) | first[:ctx])[0]
    ref_att = [fp8_attention(a["q"], a["kq"], a["vq"]) for a in rec_ref["attn"]]
    subsets = {"all": np.ones(ctx - 1, dtype=bool), "copy": copied[1:ctx], "other": ~copied[1:ctx]}
    print(f"context {ctx}: {int(subsets['copy'].sum())} of {ctx - 1} predictions are of copied tokens")
    for mode in MODES:
        model.record = rec = {}
        logits, _ = model.forward(tok, mode, scales, attn_fp8=attn_fp8)
        lp = log_softmax(logits)[:-1]
        # hidden states after every layer, every position
        for layer, (xr, xm) in enumerate(zip(rec_ref["hidden"], rec["hidden"])):
            rel = np.linalg.norm(xm - xr, axis=-1) / np.linalg.norm(xr, axis=-1)
            cos = (xm * xr).sum(-1) / (np.linalg.norm(xm, axis=-1) * np.linalg.norm(xr, axis=-1))
            for metric, want, tol in (("rel_l2", rel.mean(), 0.01), ("cosine", cos.mean(), 1e-6)):
                got, n = file_mean(layers[(layers["mode"] == mode.encode()) & (layers["layer"] == layer) &
                                          (layers["subset"] == b"all") & (layers["metric"] == metric.encode())])
                check(n == ctx and abs(got - want) <= tol * abs(want),
                      f"{mode} layer {layer} hidden {metric}: kvdrift {got:.6g} over {n} positions, "
                      f"reference {want:.6g} over {ctx} (within {tol:g} relative)")
        # router flips: the share of positions whose routed expert set differs
        for layer, (er, em) in enumerate(zip(rec_ref["experts"], rec["experts"])):
            want = float(np.any(er != em, axis=-1).mean())
            got, n = file_mean(layers[(layers["mode"] == mode.encode()) & (layers["layer"] == layer) &
                                      (layers["metric"] == b"router_flip")])
            check(n == ctx and abs(got - want) <= 2 / ctx,
                  f"{mode} layer {layer} router flips: kvdrift {got:.6g} over {n} positions, "
                  f"reference {want:.6g} (within 2 positions)")
        # attention per full-attention layer, both views, at the sampled positions
        for al, a in enumerate(rec["attn"]):
            sc = (scales["k"][al], scales["v"][al]) if mode == "fp8-cal" else (np.ones(kvh), np.ones(kvh))
            qs = None if not attn_fp8 else scales["q"][al] if mode == "fp8-cal" else np.ones(nh)
            iso_k = store(rec_ref["attn"][al]["k"], "fp8", sc[0])[0]
            iso_v = store(rec_ref["attn"][al]["v"], "fp8", sc[1])[0]
            p_ref, o_ref = ref_att[al]
            views = {"isolated": att_figures(p_ref, o_ref, *fp8_attention(rec_ref["attn"][al]["q"], iso_k, iso_v,
                                                                          qs, attn_fp8), sampled, kvh),
                     "propagated": att_figures(p_ref, o_ref, *fp8_attention(a["q"], a["kq"], a["vq"], qs, attn_fp8),
                                               sampled, kvh)}
            for view, figs in views.items():
                for metric, tol in (("kl", 0.02), ("argmax_agree", 0.01), ("out_rel_l2", 0.02)):
                    want = float(figs[metric].mean())
                    got, n = file_mean(att[(att["mode"] == mode.encode()) & (att["attn_layer"] == al) &
                                           (att["kv_head"] < 0) & (att["view"] == view.encode()) &
                                           (att["subset"] == b"all") & (att["metric"] == metric.encode())])
                    check(n == len(sampled) and abs(got - want) <= tol * abs(want),
                          f"{mode} attention layer {al} {view} {metric}: kvdrift {got:.6g} at {n} positions, "
                          f"reference {want:.6g} at {len(sampled)} (within {tol:g} relative)")
                # --attn-per-head: each KV head's KL, the mean over its query heads
                for h in range(kvh):
                    want = float(figs["kl_kvh"][h].mean())
                    got, n = file_mean(att[(att["mode"] == mode.encode()) & (att["attn_layer"] == al) &
                                           (att["kv_head"] == h) & (att["view"] == view.encode()) &
                                           (att["metric"] == b"kl")])
                    check(n == len(sampled) and abs(got - want) <= 0.02 * abs(want),
                          f"{mode} attention layer {al} {view} KV head {h} kl: kvdrift {got:.6g} at {n} "
                          f"positions, reference {want:.6g} (within 0.02 relative)")
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
    return check.finish("run figures against the reference")


if __name__ == "__main__":
    sys.exit(main())
