"""Holds /drift/generation of a `kvdrift run` sweep to the NumPy reference
model (qwen3next_ref.py).

usage: check_gen.py CKPT_DIR RESULTS.h5 TRACES.h5

RESULTS.h5: a drift sweep of one trace at one (short) context with
generation on; TRACES.h5: that trace. For every prefix the file names, the
reference continues the trace greedily with the BF16 cache and with the
mode's (fp8-cal with the file's /calibration scales), each feeding back its
own tokens, and counts from the definitions: the first step whose tokens
differ (the token count when none does) and the share of steps whose tokens
agree. The reference recomputes the whole sequence at every step (its cache
is K and V through the mode's codec, which is what a cache gives back).
"""
import sys

import numpy as np

from checks import Checks, read_sweep
from qwen3next_ref import Qwen3NextRef


def greedy(model, prefix, n, mode, scales):
    seq, out = list(prefix), []
    for _ in range(n):
        t = int(np.argmax(model.forward(np.array(seq), mode, scales)[0][-1]))
        out.append(t)
        seq.append(t)
    return np.array(out)


def main():
    ckpt, results, traces = sys.argv[1:4]
    check = Checks()

    model = Qwen3NextRef(ckpt)
    t, scales, tokens, _ = read_sweep(results, traces, ("drift/generation",), model.cfg["num_key_value_heads"])
    gen = t["drift/generation"]
    ctx = int(gen["context"][0])
    prefixes = sorted({int(p) for p in gen["prefix"]})
    want = sorted(p for p in {ctx // 4, ctx // 2, ctx} if p >= 16)
    check(prefixes == want, f"prefixes {prefixes}: a quarter, half and all of the {ctx}-token context")
    for p in prefixes:
        n = int(gen[gen["prefix"] == p]["tokens"][0])
        ref = greedy(model, tokens[:p], n, "bf16", scales)
        for mode in sorted({m.decode() for m in gen["mode"]}):
            row = gen[(gen["mode"] == mode.encode()) & (gen["prefix"] == p)]
            test = ref if mode == "bf16" else greedy(model, tokens[:p], n, mode, scales)
            diff = np.nonzero(ref != test)[0]
            first = int(diff[0]) if len(diff) else n
            agree = float(np.mean(ref == test))
            got_first, got_agree = int(row["first_divergence"][0]), float(row["agree_rate"][0])
            check(len(row) == 1 and got_first == first and abs(got_agree - agree) < 1e-12,
                  f"{mode} from prefix {p}, {n} tokens: kvdrift first divergence {got_first}, agreement "
                  f"{got_agree:.4g}; reference {first}, {agree:.4g}")
    return check.finish("generation against the reference")


if __name__ == "__main__":
    sys.exit(main())
