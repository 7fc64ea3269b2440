"""Holds /drift/kv of a `kvdrift run` sweep to the NumPy reference model
(qwen3next_ref.py): the scales each mode used and what the FP8 cache did to
the values written into it.

usage: check_kv.py CKPT_DIR RESULTS.h5 TRACES.h5

RESULTS.h5: a drift sweep of one trace at one context without generation
(every value the candidate's cache took is the trace's K or V); TRACES.h5:
that trace. Per full-attention layer, over every K (then V) value written,
from the definitions: saturated, |x / scale| above 448; flushed to zero, a
non-zero x stored as a zero code; subnormal, a non-zero code with a zero
exponent. The reference's K and V are its own (float64 from float32
inputs); a value within float32 noise of a rounding midpoint or of 448 can
land the other way, so the counts may differ by a few values in thousands.
"""
import sys

import numpy as np

from checks import Checks, read_sweep
from qwen3next_ref import Qwen3NextRef, e4m3_encode


def main():
    ckpt, results, traces = sys.argv[1:4]
    check = Checks()

    model = Qwen3NextRef(ckpt)
    kvh = model.cfg["num_key_value_heads"]
    t, cal, tokens, _ = read_sweep(results, traces, ("drift/kv", "drift/generation"), kvh)
    kv, gen = t["drift/kv"], t["drift/generation"]
    check(len(gen) == 0, f"{results}: no generation (its writes would be counted too)")
    ctx = int(kv["context"][0])
    for mode in ("fp8-cal", "fp8-unscaled"):
        model.record = rec = {}
        model.forward(tokens[:ctx], mode, cal)
        for al, a in enumerate(rec["attn"]):
            rows = kv[(kv["mode"] == mode.encode()) & (kv["attn_layer"] == al)]
            for which in "kv":
                scale = cal[which][al] if mode == "fp8-cal" else np.ones(kvh, dtype=np.float32)
                got_scale = rows[f"{which}_scale"][np.argsort(rows["kv_head"])]
                check(np.array_equal(got_scale.astype(np.float32), np.asarray(scale, dtype=np.float32)),
                      f"{mode} layer {al} {which.upper()} scales: {list(got_scale)}")
                x32 = a[which].astype(np.float32)  # [T, kv_heads, hd]
                y = np.divide(x32, np.asarray(scale, dtype=np.float32)[None, :, None], dtype=np.float32)
                codes = e4m3_encode(y) & 0x7F
                n = x32.size
                want = {"saturated": np.sum(np.abs(y) > 448), "flushed": np.sum((codes == 0) & (x32 != 0)),
                        "subnormal": np.sum(((codes & 0x78) == 0) & (codes != 0))}
                check(np.all(rows["n_values"] == n), f"{mode} layer {al}: {n} values written per K and V")
                for what, cnt in want.items():
                    got = float(rows[f"{which}_{what}_frac"][0])
                    ok = np.all(rows[f"{which}_{what}_frac"] == got) and abs(got * n - cnt) <= max(3, 1e-3 * n)
                    check(ok, f"{mode} layer {al} {which.upper()} {what}: kvdrift {got * n:.0f} of {n}, "
                              f"reference {cnt} (within max(3, 0.1%))")
    return check.finish("cache counters against the reference")


if __name__ == "__main__":
    sys.exit(main())
