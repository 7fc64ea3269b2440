"""Holds kvdrift's forward pass to Hugging Face transformers' own Qwen3-Next.

usage: hf_check.py CKPT_DIR DUMP_DIR FORWARD_TXT

An optional check beside the NumPy reference (check.py): it needs torch and
transformers (several GB from PyPI), which the project's own set-up does not
install. CKPT_DIR is a checkpoint (`kvdrift export` output, or a Qwen3.5 one
transformers wrote: hf_make_qwen35.py), DUMP_DIR and FORWARD_TXT are
`kvdrift forward --dump` output and its printed table for the same weights,
in mode bf16 and any of fp8-cal (per layer or per head), fp8-unscaled and
fp8-e5m2.

transformers loads the checkpoint as Qwen3NextForCausalLM, or
Qwen3_5MoeForCausalLM / Qwen3_5ForCausalLM (float32 compute on the BF16
weights, as kvdrift computes) through its own weight mapping and its own
Gated DeltaNet, MoE and attention code. The one thing added is what
the KV cache does to K and V: a registered attention function reads, in
place of its own K and V, what the C's cache stored (its dumped BF16 or FP8
bytes, decoded by torch, times the scale), as check.py does. A value within
float32 noise of a rounding midpoint may round the other way in the two
computations; feeding that one step on would leave the comparison measuring
that flip (amplified by a router choosing between near-tied experts on
random weights) rather than the model. That the stored bytes are the right
ones is checked on its own: torch's codecs (BF16, E4M3 of x / scale
saturating at 448, E5M2 saturating at 57344) applied to the C's K and V.

Checks:
  - the checkpoint loads with no missing, unexpected or mismatched weights;
  - K and V before the cache agree with the C's to 1e-4 relative L2;
  - torch's codec applied to the C's K and V gives exactly the bytes the C
    cache stored (BF16, E4M3, E5M2), every byte;
  - logits agree per mode to 1e-4 relative L2;
  - the drift figures kvdrift printed (mean KL against BF16, top-1
    agreement) agree with the same figures computed from transformers'
    logits: KL within 1% relative, top-1 within 1 position.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from checks import Checks

MODES = ("bf16", "fp8-cal", "fp8-unscaled", "fp8-e5m2")
CLASSES = ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM")
# mode -> (torch's format, its largest finite value); the cache saturates
FP8 = {"fp8-cal": (torch.float8_e4m3fn, 448.0), "fp8-unscaled": (torch.float8_e4m3fn, 448.0),
       "fp8-e5m2": (torch.float8_e5m2, 57344.0)}

# what the registered attention function does on this pass: the layer
# ordinals, the K and V it saw, and what the C's cache gave back
state = {"attn_ordinal": {}, "kv": {}, "stored": {}}


def fp8_codes(x, mode, s):
    """torch's FP8 of x / s (s broadcast over x), saturating, as a float8 tensor."""
    fmt, top = FP8[mode]
    return torch.clamp(x / s, -top, top).to(fmt)


def decode_stored(raw, mode, scale, shape):
    """The C cache's bytes [T, kv_heads, head_dim] as the values it gives back,
    [1, kv_heads, T, head_dim] float32."""
    if mode == "bf16":
        x = torch.from_numpy(raw.view("<i2").reshape(shape).copy()).view(torch.bfloat16)
        x = x.to(torch.float32)
    else:
        fmt = FP8[mode][0]
        x = torch.from_numpy(raw.reshape(shape).copy()).view(fmt).to(torch.float32)
        x = x * scale.view(1, -1, 1)
    return x.transpose(0, 1).unsqueeze(0)


def kvdrift_kv_attention(module, query, key, value, attention_mask, **kwargs):
    al = state["attn_ordinal"][module.layer_idx]
    state["kv"][al] = (key.detach().clone(), value.detach().clone())
    k_stored, v_stored = state["stored"][al]
    return sdpa_attention_forward(module, query, k_stored, v_stored, attention_mask, **kwargs)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def printed_figures(path):
    """kv_mode -> {column: value} from `kvdrift forward`'s table."""
    rows, cols = {}, None
    with open(path) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "kv_mode":
                cols = w
            elif cols and len(w) == len(cols) and w[0] in MODES:
                rows[w[0]] = {c: float(v) for c, v in zip(cols[1:], w[1:])}
    return rows


def main():
    ckpt, dump, table = sys.argv[1], sys.argv[2], sys.argv[3]
    check = Checks()

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    transformers.utils.logging.disable_progress_bar()
    AttentionInterface.register("kvdrift_kv", kvdrift_kv_attention)
    model, info = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                       attn_implementation="kvdrift_kv",
                                                       output_loading_info=True)
    model.eval()
    cfg = model.config.get_text_config()
    lost = {k: sorted(v) for k, v in info.items() if v}
    check(type(model).__name__ in CLASSES and not lost,
          f"{ckpt} loads as {type(model).__name__} with every weight in place"
          + (f" (not: {lost})" if lost else ""))
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    state["attn_ordinal"] = {layer: al for al, layer in enumerate(full)}
    kvh, hd = cfg.num_key_value_heads, cfg.head_dim

    tokens = np.fromfile(os.path.join(dump, "tokens.i32"), dtype="<i4")
    T, V = len(tokens), cfg.vocab_size
    with open(os.path.join(dump, "scales.json")) as f:
        sj = json.load(f)
    cal = [(torch.tensor(l["k_scale"], dtype=torch.float32), torch.tensor(l["v_scale"], dtype=torch.float32))
           for l in sj["layers"]]
    ones = [(torch.ones(kvh), torch.ones(kvh)) for _ in full]
    ids = torch.tensor(tokens[None].astype(np.int64))
    modes = [m for m in MODES if os.path.isdir(os.path.join(dump, m))]
    check(modes[0] == "bf16" and len(modes) > 1, f"{dump}: bf16 and other modes (found {modes})")
    print(f"fp8-cal scales: {sj['recipe']}, {sj['granularity']}")

    logp = {}
    for mode in modes:
        d = os.path.join(dump, mode)
        scales = cal if mode == "fp8-cal" else ones
        state["kv"] = {}
        state["stored"] = {
            al: tuple(decode_stored(np.fromfile(os.path.join(d, f"{w}_cache.{al}.bin"), dtype=np.uint8),
                                    mode, scales[al][i], (T, kvh, hd)) for i, w in enumerate("kv"))
            for al in range(len(full))}
        with torch.no_grad():
            logits_hf = model(ids, use_cache=False).logits[0].numpy()
        logits_c = np.fromfile(os.path.join(d, "logits.f32"), dtype="<f4").reshape(T, V)
        e = rel_l2(logits_c, logits_hf)
        check(e < 1e-4, f"{mode}: logits over {T} tokens, relative L2 {e:.2e} < 1e-4")
        logp[mode] = log_softmax(logits_hf)
        for al in range(len(full)):
            for which, x_hf in zip("kv", state["kv"][al]):
                pre = np.fromfile(os.path.join(d, f"{which}_pre.{al}.f32"), dtype="<f4").reshape(T, kvh, hd)
                raw = np.fromfile(os.path.join(d, f"{which}_cache.{al}.bin"), dtype=np.uint8)
                mine = x_hf[0].transpose(0, 1).numpy()
                e = rel_l2(pre.astype(np.float64), mine.astype(np.float64))
                check(e < 1e-4, f"{mode}: layer {al} {which.upper()} before the cache, relative L2 {e:.2e} < 1e-4")
                # torch's codec on the C's own values: the stored bytes, exactly
                x = torch.from_numpy(pre)
                if mode == "bf16":
                    want = x.to(torch.bfloat16).view(torch.int16).numpy().view("<u2")
                    got = raw.view("<u2").reshape(T, kvh, hd)
                    name = "BF16"
                else:
                    s = scales[al]["kv".index(which)].view(1, -1, 1)
                    want = fp8_codes(x, mode, s).view(torch.uint8).numpy()
                    got = raw.reshape(T, kvh, hd)
                    name = ("E5M2" if mode == "fp8-e5m2" else "E4M3") + "(value / scale), saturating"
                n = int((want != got).sum())
                check(n == 0, f"{mode}: layer {al} {which.upper()} cache bytes = torch's {name} of the C values: "
                              f"{got.size - n} of {got.size} identical")

    printed = printed_figures(table)
    check(set(printed) == set(modes), f"{table}: figures for {', '.join(modes)} (found {sorted(printed)})")
    p_ref = np.exp(logp["bf16"])
    for mode in modes[1:]:
        if mode not in printed:
            continue
        kl = float(np.mean(np.sum(p_ref * (logp["bf16"] - logp[mode]), axis=-1)))
        agree = int(np.sum(np.argmax(logp["bf16"], -1) == np.argmax(logp[mode], -1)))
        kl_c = printed[mode]["kl_mean"]
        agree_c = round(printed[mode]["top1_agree"] * T)
        check(abs(kl_c - kl) <= 0.01 * kl, f"{mode}: mean KL against BF16, kvdrift {kl_c:.4e}, "
                                           f"transformers {kl:.4e} (within 1%)")
        check(abs(agree_c - agree) <= 1, f"{mode}: top-1 agreement with BF16, kvdrift {agree_c} of {T}, "
                                         f"transformers {agree} of {T} (within 1)")
    return check.finish("transformers check")


if __name__ == "__main__":
    sys.exit(main())
