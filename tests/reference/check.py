"""Holds kvdrift's C forward pass to the NumPy reference (qwen3next_ref.py).

usage: check.py CKPT_DIR DUMP_DIR [MODES]

CKPT_DIR is `kvdrift export` output, DUMP_DIR `kvdrift forward --dump` output
for MODES (comma-separated; by default bf16, fp8-cal, fp8-unscaled,
nvfp4-cal, nvfp4-unscaled, fp8-token, int8-token, int8-token-rn and
int4-token).
Checks, per mode:
  - logits: relative L2 error against the reference below 1e-3, 2e-3 for
    int4-token (for the quantized modes the reference's attention reads the
    C's stored codes, so a code flipped at a rounding midpoint does not
    propagate);
  - the cache bytes: the reference's own E4M3 (NVFP4) codec applied to the
    K/V the C computed gives exactly the bytes the C cache stored (every byte);
  - K and V themselves agree with the reference's to 1e-4 relative L2, and the
    reference's own codes equal the C's except (at most 1 in 1000) where the
    two computations' values straddle a rounding midpoint, closer together
    than 1e-4 of the tensor's rms: there neither code is wrong, the two
    float32 computations differ in their last bits.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402
from qwen3next_ref import (Qwen3NextRef, e4m3_decode, e4m3_encode, e4m3t_encode,  # noqa: E402
                           i4t_encode, i8t_encode, nvfp4_encode, round_bf16)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ckpt, dump = sys.argv[1], sys.argv[2]
    model = Qwen3NextRef(ckpt)
    c = model.cfg
    tokens = np.fromfile(os.path.join(dump, "tokens.i32"), dtype="<i4")
    T, V = len(tokens), c["vocab_size"]
    kvh, hd = c["num_key_value_heads"], c["head_dim"]
    with open(os.path.join(dump, "scales.json")) as f:
        sj = json.load(f)
    scales = {"k": [np.array(l["k_scale"], dtype=np.float32) for l in sj["layers"]],
              "v": [np.array(l["v_scale"], dtype=np.float32) for l in sj["layers"]]}
    check = Checks()

    modes = ("bf16", "fp8-cal", "fp8-unscaled", "nvfp4-cal", "nvfp4-unscaled", "fp8-token",
             "int8-token", "int8-token-rn", "int4-token")
    if len(sys.argv) > 3:
        modes = tuple(sys.argv[3].split(","))
    for mode in modes:
        d = os.path.join(dump, mode)
        nv, tok = mode.startswith("nvfp4"), mode in ("fp8-token", "int8-token", "int8-token-rn", "int4-token")
        i4 = mode == "int4-token"
        nc = hd // 2 if i4 else hd  # bytes of codes a row
        rb = hd // 2 + hd // 16 if nv else nc + 4 if tok else hd  # bytes a row
        logits_c = np.fromfile(os.path.join(d, "logits.f32"), dtype="<f4").reshape(T, V)
        forced = None
        if mode != "bf16":
            # attention reads the C's stored codes (see Qwen3NextRef.forward)
            forced = {}
            for al in range(len(sj["layers"])):
                kc = np.fromfile(os.path.join(d, f"k_cache.{al}.bin"), dtype=np.uint8).reshape(T, kvh, rb)
                vc = np.fromfile(os.path.join(d, f"v_cache.{al}.bin"), dtype=np.uint8).reshape(T, kvh, rb)
                forced[al] = (kc, vc)
        logits_r, caches = model.forward(tokens, mode, scales, forced)
        e = rel_l2(logits_c, logits_r)
        # int4-token rounds the rotated query and the attention's output to
        # BF16, where a last float32 bit of either computation can take the
        # neighbouring value: 2e-3, against the 0.23 the mode itself moves
        # tiny's logits
        tol = 2e-3 if i4 else 1e-3
        check(e < tol, f"{mode}: logits over {T} tokens, relative L2 {e:.2e} < {tol:g}")
        for al, (k_r, v_r, kc_r, vc_r) in enumerate(caches):
            for which, x_r, codes_r in (("k", k_r, kc_r), ("v", v_r, vc_r)):
                pre = np.fromfile(os.path.join(d, f"{which}_pre.{al}.f32"), dtype="<f4").reshape(T, kvh, hd)
                raw = np.fromfile(os.path.join(d, f"{which}_cache.{al}.bin"), dtype=np.uint8)
                e = rel_l2(pre.astype(np.float64), x_r)
                check(e < 1e-4, f"{mode}: layer {al} {which.upper()} before the cache, relative L2 {e:.2e} < 1e-4")
                if mode == "bf16":
                    stored = raw.view("<u2").reshape(T, kvh, hd)
                    mine = round_bf16(pre).view(np.uint32) >> 16
                    check(np.array_equal(stored, mine.astype(np.uint16)),
                          f"{mode}: layer {al} {which.upper()} cache bytes = BF16 of the C values ({stored.size} values)")
                    continue
                if nv:
                    # the reference's own NVFP4 codec on the C's values, every
                    # byte; then its own values' rows: a group's largest value
                    # a float32 ulp from a block-scale boundary moves the
                    # whole group, so rows, not codes, are counted
                    stored = raw.reshape(T, kvh, rb)
                    sc = np.ones(kvh, dtype=np.float32)
                    if mode == "nvfp4-cal":
                        sc = np.divide(scales[which][al], np.float32(6.0), dtype=np.float32)
                    mine = nvfp4_encode(pre, sc[None, :])[0]
                    check(np.array_equal(stored, mine),
                          f"{mode}: layer {al} {which.upper()} cache bytes = NVFP4(C values, global scale), "
                          f"every one of {stored.size}")
                    same = np.all(codes_r == stored, -1)
                    check(same.mean() >= 0.99,
                          f"{mode}: layer {al} {which.upper()} reference's own rows: {int(same.sum())} of {same.size} identical")
                    continue
                if tok:
                    # the reference's own per-row codec on the C's values,
                    # every byte, the scales included; then its own values'
                    # rows: their largest value, computed apart, moves the
                    # row's scale in its last bits, so the codes are compared
                    # (they move only at a rounding midpoint) and the scales
                    # to 1e-5
                    stored = raw.reshape(T, kvh, rb)
                    mine = (e4m3t_encode(pre) if mode == "fp8-token" else i4t_encode(pre) if i4
                            else i8t_encode(pre, mode == "int8-token-rn"))[0]
                    check(np.array_equal(stored, mine),
                          f"{mode}: layer {al} {which.upper()} cache bytes = {mode}(C values, each row's "
                          f"own scale), every one of {stored.size}")
                    sr = np.ascontiguousarray(codes_r[..., nc:]).view("<f4")
                    sc_ = np.ascontiguousarray(stored[..., nc:]).view("<f4")
                    e = float(np.max(np.abs(sr - sc_) / sc_))
                    if i4:
                        # the rotation's sums in the reference's own order of
                        # K's computation move a value's BF16 rounding, so
                        # codes, zero points and scales: rows' values are
                        # compared, in the rotated basis, to a step of each
                        from qwen3next_ref import i4t_decode
                        step = np.ascontiguousarray(stored[..., nc:]).view("<u4") & np.uint32(0xFFFFFFF0)
                        step = step.view("<f4").astype(np.float64)
                        dv = np.abs(i4t_decode(codes_r) - i4t_decode(stored)) / step
                        n = int((dv > 1.01).sum())
                        check(n <= dv.size // 100 and e < 1e-2,
                              f"{mode}: layer {al} {which.upper()} reference's own rows: {dv.size - n} of "
                              f"{dv.size} values within a step; scales within {e:.1e}")
                        continue
                    if mode == "fp8-token":
                        same = np.all(codes_r[..., :hd] == stored[..., :hd], -1)
                        check(same.mean() >= 0.99 and e < 1e-5,
                              f"{mode}: layer {al} {which.upper()} reference's own rows: {int(same.sum())} "
                              f"of {same.size} codes identical, scales within {e:.1e}")
                    else:
                        # the codes step at every integer (truncating) or
                        # half (rounding), and the row's scale moves x / s
                        # there: codes one step apart, few
                        step = np.abs(codes_r[..., :hd].view(np.int8).astype(int)
                                      - stored[..., :hd].view(np.int8).astype(int))
                        n = int((step > 0).sum())
                        check(step.max() <= 1 and n <= step.size // 100 and e < 1e-5,
                              f"{mode}: layer {al} {which.upper()} reference's own codes: {step.size - n} of "
                              f"{step.size} identical, the rest one step apart; scales within {e:.1e}")
                    continue
                stored = raw.reshape(T, kvh, hd)
                sc = scales[which][al] if mode == "fp8-cal" else np.ones(kvh, dtype=np.float32)
                mine = e4m3_encode(np.divide(pre, sc[None, :, None], dtype=np.float32))
                check(np.array_equal(stored, mine),
                      f"{mode}: layer {al} {which.upper()} cache bytes = E4M3(C value / scale), every one of {stored.size}")
                # the reference's own values through its own codec
                diff = codes_r != stored
                n = int(diff.sum())
                step_ok = True
                if n:
                    # a flipped code is fine only where the C value and the
                    # reference value fall on either side of the rounding
                    # midpoint between the two codes, within float32 noise
                    # compare in the codec's own domain, x / scale, where the
                    # C rounded its float32 quotient
                    hs = sc[np.nonzero(diff)[1]]
                    mid = 0.5 * (e4m3_decode(codes_r[diff]) + e4m3_decode(stored[diff]))
                    yr = x_r[diff] / hs.astype(np.float64)
                    yc = np.divide(pre[diff], hs, dtype=np.float32).astype(np.float64)
                    straddle = (yr - mid) * (yc - mid) <= 0
                    # float32 noise is relative to the tensor's magnitude,
                    # not to one small element of it
                    rms = float(np.sqrt(np.mean((x_r / sc[None, :, None].astype(np.float64)) ** 2)))
                    close = np.abs(yr - yc) <= 1e-4 * rms
                    step_ok = bool(np.all(straddle & close))
                    if not step_ok:
                        print("   flips (ref, C, midpoint):", list(zip(yr, yc, mid)))
                check(n <= max(1, stored.size // 1000) and step_ok,
                      f"{mode}: layer {al} {which.upper()} reference's own codes: {stored.size - n} of {stored.size} identical, "
                      f"{n} at a rounding boundary")
    return check.finish("reference")


if __name__ == "__main__":
    sys.exit(main())
