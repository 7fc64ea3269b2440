"""A device run's results file against the CPU's run of the same sweep, with
the model test's tolerances (tests/gpu/test_cuda_model.c): the same rows
(keys, counts, NaNs in the same places); divergences within 5% relative
plus 1e-6; agreement fractions and delta-p within 0.02 (absolute, beside
the 5%), NLL differences within 3e-4 (they are differences of two large
sums); the cache's counters within 1e-3 relative plus two values in n;
greedy generations one token apart at most; calibration within 1e-5.
usage: drift_close.py DEVICE.h5 CPU.h5   (exit 1, the differences listed)"""
import sys

import h5py
import numpy as np

REL = 0.05
# absolute allowances by metric, beside REL; others 1e-6
ATOL = {b"top1_agree": 0.02, b"delta_p": 0.02, b"delta_nll": 3e-4, b"argmax_agree": 0.02,
        b"same_top_p": 0.02, b"same_top_p_err": 0.02, b"delta_p_mean": 0.02,
        b"delta_p_rms": 0.02, b"ln_ppl_ratio": 3e-4}


def same_bits(a, b):
    """Two tables' rows bit for bit, field by field: NaNs equal to
    themselves, and the padding between fields (which h5py leaves as it
    found it in memory) not compared."""
    return len(a) == len(b) and a.dtype.names == b.dtype.names and all(
        a[n].tobytes() == b[n].tobytes() for n in a.dtype.names)


def fp8_codes_close(what, xg, xc, cg, cc, most=4):
    """Two back ends' FP8 codes of the same K or V values, with the float32
    values each wrote (xg, xc): the same byte wherever the two values are
    the same bits; elsewhere, where sums in another order put a value the
    other side of a rounding midpoint, one step apart, the same sign, at
    most `most` codes. Returns what is wrong (a list of lines)."""
    if not (xg.size == xc.size == cg.size == cc.size):
        return [f"{what}: {xg.size}, {xc.size} values and {cg.size}, {cc.size} codes"]
    apart = cg != cc
    step = np.abs(cg.astype(int) - cc.astype(int))
    if np.any(apart & (xg.view(np.uint32) == xc.view(np.uint32))):
        return [f"{what}: codes differ where the values are the same bits"]
    if np.any(step[apart] != 1) or apart.sum() > most:
        return [f"{what}: {apart.sum()} codes differ (at most {most}, one step each): "
                f"{list(zip(cg[apart][:8], cc[apart][:8]))}"]
    return []


def close(dev, cpu):
    bad = []
    for k in ("k_scale", "v_scale"):
        x, y = dev["calibration"][k][:], cpu["calibration"][k][:]
        if x.shape != y.shape or not np.allclose(x, y, rtol=1e-5, atol=0):
            bad.append(f"calibration {k}: {x} against {y}")

    def rows(t, floats, atol=None):
        x, y = dev[t][:], cpu[t][:]
        if len(x) != len(y) or len(x) == 0:
            return bad.append(f"{t}: {len(x)} rows, the CPU's {len(y)}")
        for n in x.dtype.names:
            if n not in floats:
                if not (x[n] == y[n]).all():
                    bad.append(f"{t}.{n}: differs")
                continue
            u, v = x[n].astype(float), y[n].astype(float)
            nan = np.isnan(u) | np.isnan(v)
            if (np.isnan(u) != np.isnan(v)).any():
                bad.append(f"{t}.{n}: NaN in other rows")
            a = floats[n][1] if atol is None else np.array([atol.get(m, 1e-6) for m in x["metric"]])
            e = np.where(nan, 0, abs(u - v) - (floats[n][0] * np.maximum(abs(u), abs(v)) + a))
            i = int(np.argmax(e))
            if e[i] > 0:
                what = f" ({x['metric'][i].decode()})" if "metric" in x.dtype.names else ""
                bad.append(f"{t}.{n}[{i}]{what}: {u[i]:.9g} on the device, {v[i]:.9g} on the CPU")

    div = (REL, None)
    for t in ("drift/output", "drift/layers", "drift/attention"):
        rows(t, {"mean": div, "ci95": div}, ATOL)
    rows("drift/summary", {"value": div}, ATOL)
    # a code written one step apart moves a share by 1/n
    n = float(cpu["drift/kv"]["n_values"].min()) if len(cpu["drift/kv"]) else 1.0
    rows("drift/kv", {f: (1e-3, 2 / n) for f in (
        "k_scale", "v_scale", "k_saturated_frac", "k_flushed_frac", "k_subnormal_frac",
        "v_saturated_frac", "v_flushed_frac", "v_subnormal_frac")})
    if len(cpu["drift/generation"]):
        tokens = float(cpu["drift/generation"]["tokens"].min())
        rows("drift/generation", {"agree_rate": (0, 1 / tokens + 1e-9),
                                  "first_divergence": (0, 1)})
    return bad


if __name__ == "__main__":
    bad = close(h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"))
    for p in bad:
        print("  " + p)
    sys.exit(1 if bad else 0)
