"""Test helper: read and write safetensors files with only the standard
library and numpy, to build checkpoints kvdrift must load or refuse."""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = (meta["dtype"], meta["shape"], raw[base + a:base + b])
    return out


def write(path, tensors, header_patch=None):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if header_patch:
        header_patch(header)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(values):
    a = np.asarray(values, dtype="<f4")
    return ("F32", list(a.shape), a.tobytes())


def main():
    cmd = sys.argv[1]
    if cmd in ("add-scales", "add-scales-as"):
        # [add-scales-as STYLE] DIR LAYER:K:V[:Q] ... -> kv_scales.safetensors + index, under
        # ModelOpt's names or STYLE's: quark (k_proj.output_scale), attn (attn.k_scale),
        # legacy (one kv_scale, the K value, for both). Q: the query scale (FP8 attention),
        # one value or comma-separated per head, as self_attn.q_scale (modelopt style:
        # llm-compressor's name), q_proj.output_scale (quark) or attn.q_scale (attn)
        style = sys.argv.pop(2) if cmd == "add-scales-as" else "modelopt"
        d = sys.argv[2]
        scales = {}
        for spec in sys.argv[3:]:
            layer, k, v, *q = spec.split(":")
            p = f"model.layers.{layer}.self_attn"
            if q:
                qn = {"modelopt": "q_scale", "quark": "q_proj.output_scale", "attn": "attn.q_scale"}[style]
                qv = [float(x) for x in q[0].split(",")]
                scales[f"{p}.{qn}"] = f32(qv if len(qv) > 1 else qv[0])
            if style == "legacy":
                scales[f"{p}.kv_scale"] = f32(float(k))
                continue
            kn, vn = {"modelopt": ("k_proj.k_scale", "v_proj.v_scale"),
                      "quark": ("k_proj.output_scale", "v_proj.output_scale"),
                      "attn": ("attn.k_scale", "attn.v_scale")}[style]
            scales[f"{p}.{kn}"] = f32(float(k))
            scales[f"{p}.{vn}"] = f32(float(v))
        write(f"{d}/kv_scales.safetensors", scales)
        names = {n: "model.safetensors" for n in read(f"{d}/model.safetensors")}
        names.update({n: "kv_scales.safetensors" for n in scales})
        json.dump({"metadata": {}, "weight_map": names}, open(f"{d}/model.safetensors.index.json", "w"))
    elif cmd == "fuse-experts":  # DIR: per-expert tensors -> gate_up_proj / down_proj
        d = sys.argv[2]
        t = read(f"{d}/model.safetensors")
        cfg = json.load(open(f"{d}/config.json"))
        E = cfg["num_experts"]
        out = {}
        for name, v in t.items():
            if ".mlp.experts." not in name:
                out[name] = v
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}.mlp.experts"
            gu = b"".join(t[f"{p}.{e}.gate_proj.weight"][2] + t[f"{p}.{e}.up_proj.weight"][2] for e in range(E))
            dn = b"".join(t[f"{p}.{e}.down_proj.weight"][2] for e in range(E))
            I, H = t[f"{p}.0.gate_proj.weight"][1]
            out[f"{p}.gate_up_proj"] = ("BF16", [E, 2 * I, H], gu)
            out[f"{p}.down_proj"] = ("BF16", [E, H, I], dn)
        write(f"{d}/model.safetensors", out)
    elif cmd == "past-end":  # FILE: a tensor's data_offsets run past the end of the file
        t = read(sys.argv[2])
        first = next(iter(t))
        def patch(h):
            h[first]["data_offsets"][1] += 1 << 30
        write(sys.argv[2], t, patch)
    elif cmd == "overlap":  # FILE: two tensors share bytes
        t = read(sys.argv[2])
        names = [n for n in t if t[n][0] == "BF16"][:2]
        def patch(h):
            a, b = h[names[0]]["data_offsets"], h[names[1]]["data_offsets"]
            if b[1] - b[0] <= a[1] - a[0]:
                h[names[1]]["data_offsets"] = [a[0], a[0] + (b[1] - b[0])]
        write(sys.argv[2], t, patch)
    elif cmd == "fp8-weight":  # FILE NAME [DTYPE]: re-type one weight as F8_E4M3 (or DTYPE), half the bytes
        t = read(sys.argv[2])
        dt, shape, data = t[sys.argv[3]]
        t[sys.argv[3]] = (sys.argv[4] if len(sys.argv) > 4 else "F8_E4M3", shape, data[: len(data) // 2])
        write(sys.argv[2], t)
    elif cmd == "fp8-quantize":  # DIR MODE REF_DIR: FP8 weights with scales, and their values in F32
        fp8_quantize(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "retag":  # FILE NAME DTYPE SHAPE: one tensor re-typed and re-shaped, its bytes cut to fit
        t = read(sys.argv[2])
        dt, shape = sys.argv[4], json.loads(sys.argv[5])
        bits = {"U8": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "BF16": 16, "F32": 32}[dt]
        t[sys.argv[3]] = (dt, shape, t[sys.argv[3]][2][: int(np.prod(shape)) * bits // 8])
        write(sys.argv[2], t)
    elif cmd == "merge-into-model":
        # DIR FILE: FILE's tensors moved into model.safetensors, halfway through its data
        # (where no sampled window of a large file reaches them), the index too
        d, f = sys.argv[2], sys.argv[3]
        t, extra = read(f"{d}/model.safetensors"), read(f"{d}/{f}")
        items = list(t.items())
        half = len(items) // 2
        t = dict(items[:half] + list(extra.items()) + items[half:])
        write(f"{d}/model.safetensors", t)
        os.remove(f"{d}/{f}")
        json.dump({"metadata": {}, "weight_map": {n: "model.safetensors" for n in t}},
                  open(f"{d}/model.safetensors.index.json", "w"))
    elif cmd == "poke":  # FILE NAME INDEX BYTE: set one byte of a tensor's data
        t = read(sys.argv[2])
        dt, shape, data = t[sys.argv[3]]
        b = bytearray(data)
        b[int(sys.argv[4])] = int(sys.argv[5], 0)
        t[sys.argv[3]] = (dt, shape, bytes(b))
        write(sys.argv[2], t)
    elif cmd == "same-values":  # FILE_A FILE_B: the same tensor names, each with the same float values
        a, b = read(sys.argv[2]), read(sys.argv[3])
        if sorted(a) != sorted(b):
            raise SystemExit(f"tensor names differ: {sorted(set(a) ^ set(b))[:4]}")
        for n in a:
            va, vb = values(*a[n]), values(*b[n])
            if va.shape != vb.shape or not np.array_equal(va, vb):
                raise SystemExit(f"{n}: values differ")
        print(f"{len(a)} tensors, the same values")
    elif cmd == "nudge":  # FILE: every BF16 value moved by one unit in the last place (a "fine-tune"), the header byte for byte as it was
        raw = bytearray(open(sys.argv[2], "rb").read())
        n = struct.unpack("<Q", raw[:8])[0]
        for name, meta in json.loads(raw[8:8 + n]).items():
            if name != "__metadata__" and meta["dtype"] == "BF16":
                a, b = (8 + n + o for o in meta["data_offsets"])
                raw[a:b] = (np.frombuffer(bytes(raw[a:b]), dtype="<u2") ^ np.uint16(1)).tobytes()
        open(sys.argv[2], "wb").write(raw)
    elif cmd == "inline-scales":  # DIR: kv_scales.safetensors moved into model.safetensors (as exporters put them)
        d = sys.argv[2]
        t = read(f"{d}/model.safetensors")
        sc = read(f"{d}/kv_scales.safetensors")
        t.update(sc)
        write(f"{d}/model.safetensors", t, lambda h: h.update({"__metadata__": {"format": "pt"}}))
        os.remove(f"{d}/kv_scales.safetensors")
        ix = json.load(open(f"{d}/model.safetensors.index.json"))
        ix["weight_map"].update({n: "model.safetensors" for n in sc})
        json.dump(ix, open(f"{d}/model.safetensors.index.json", "w"))
    elif cmd == "same-but-scales":  # FILE_A FILE_B: B holds A's tensors, byte for byte, less its KV scales, and its header metadata
        a, b = read(sys.argv[2]), read(sys.argv[3])
        meta = lambda p: json.loads(open(p, "rb").read()[8:8 + struct.unpack("<Q", open(p, "rb").read(8))[0]]).get("__metadata__")
        kv = (".k_scale", ".v_scale", ".kv_scale", ".k_proj.output_scale", ".v_proj.output_scale")
        kept = {n: v for n, v in a.items() if not n.endswith(kv)}
        if kept != b or meta(sys.argv[2]) != meta(sys.argv[3]):
            raise SystemExit(f"differ: {sorted(set(kept) ^ set(b))[:4]} metadata {meta(sys.argv[2])} {meta(sys.argv[3])}")
        print(f"{len(b)} tensors as they were, {len(a) - len(b)} KV scales removed")
    elif cmd == "rm":  # FILE NAME: remove one tensor from a file
        t = read(sys.argv[2])
        del t[sys.argv[3]]
        write(sys.argv[2], t)
    elif cmd == "fp4-quantize":  # DIR MODE REF_DIR: packed 4-bit weights with scales, and their values in F32
        fp4_quantize(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "retype":  # FILE F32|F16: every BF16 tensor re-stored in another float dtype
        t = read(sys.argv[2])
        to = sys.argv[3]
        for name, (dt, shape, data) in list(t.items()):
            if dt != "BF16":
                continue
            f = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view("<f4")
            t[name] = (to, shape, f.astype("<f4" if to == "F32" else "<f2").tobytes())
        write(sys.argv[2], t)
    elif cmd == "qwen35":  # SRC DST SHARDS: a Qwen3-Next-named checkpoint in Qwen3.5's layout
        qwen35(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "drop":  # DIR NAME: remove one tensor from a sharded checkpoint
        d, name = sys.argv[2], sys.argv[3]
        ix = json.load(open(f"{d}/model.safetensors.index.json"))
        f = ix["weight_map"].pop(name)
        t = read(f"{d}/{f}")
        del t[name]
        write(f"{d}/{f}", t)
        json.dump(ix, open(f"{d}/model.safetensors.index.json", "w"))
    elif cmd == "dup":  # DIR NAME: the same tensor in a second shard as well
        d, name = sys.argv[2], sys.argv[3]
        ix = json.load(open(f"{d}/model.safetensors.index.json"))
        t = read(f"{d}/{ix['weight_map'][name]}")
        write(f"{d}/extra.safetensors", {name: t[name]})
        ix["weight_map"]["extra.copy"] = "extra.safetensors"
        json.dump(ix, open(f"{d}/model.safetensors.index.json", "w"))
    elif cmd == "lm-head-is-embed":  # DIR: lm_head.weight := the embedding (still untied)
        t = read(f"{sys.argv[2]}/model.safetensors")
        t["lm_head.weight"] = t["model.embed_tokens.weight"]
        write(f"{sys.argv[2]}/model.safetensors", t)
    elif cmd == "tie":  # DIR: tie_word_embeddings true, no lm_head.weight
        d = sys.argv[2]
        t = read(f"{d}/model.safetensors")
        del t["lm_head.weight"]
        write(f"{d}/model.safetensors", t)
        edit_config(d, lambda c: c.update(tie_word_embeddings=True))
    elif cmd == "config":  # DIR KEY JSON_VALUE: set one config.json field
        edit_config(sys.argv[2], lambda c: c.update({sys.argv[3]: json.loads(sys.argv[4])}))
    else:
        raise SystemExit(f"unknown command {cmd}")


def fp8_quantize(d, mode, ref):
    """Quantize every projection of checkpoint d to E4M3 in place, as FP8
    checkpoints store them: mode "block64" (NAME_scale_inv, one scale per
    64 x 64 block, quantization_config.weight_block_size; "block64-ue8m0"
    the same with power-of-two F8_E8M0 scales), "channel" (NAME_scale
    [rows, 1]) or "tensor" (NAME_scale, one value); scale = absmax / 448 of
    what it covers. ref gets the dequantized values (code * scale)."""
    from qwen3next_ref import e4m3_decode, e4m3_encode

    def one(name, w):
        R, C = w.shape
        if mode.startswith("block64"):
            B = 64
            sc = np.ones(((R + B - 1) // B, (C + B - 1) // B), dtype=np.float32)
            for i in range(sc.shape[0]):
                for j in range(sc.shape[1]):
                    m = np.abs(w[i * B:(i + 1) * B, j * B:(j + 1) * B]).max()
                    sc[i, j] = m / np.float32(448) if m > 0 else 1
            if mode == "block64-ue8m0":  # rounded up to a power of two (DeepSeek's UE8M0)
                sc = np.exp2(np.ceil(np.log2(sc))).astype(np.float32)
            full = np.repeat(np.repeat(sc, B, 0), B, 1)[:R, :C]
            sname = name + "_scale_inv"
        else:
            m = np.abs(w).max(1, keepdims=True) if mode == "channel" else np.abs(w).max()
            sc = np.asarray(np.where(m > 0, m / np.float32(448), 1), dtype=np.float32)
            full = np.broadcast_to(sc, (R, C))
            sname = name + "_scale"
        codes = e4m3_encode(np.divide(w, full, dtype=np.float32))
        vals = e4m3_decode(codes).astype(np.float32) * full.astype(np.float32)
        if mode == "block64-ue8m0":
            scale = ("F8_E8M0", list(sc.shape), (np.log2(sc).astype(np.int32) + 127).astype(np.uint8).tobytes())
        else:
            scale = ("F32", list(sc.shape), sc.tobytes())
        return {name: ("F8_E4M3", [R, C], codes.tobytes()), sname: scale}, vals

    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    if mode.startswith("block64"):
        qc["weight_block_size"] = [64, 64]
    quantize_checkpoint(d, ref, one, qc)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def e2m1_encode(x):
    """float32 -> E2M1 codes (sign bit 8), nearest, ties to the even code,
    saturating at +-6."""
    a = np.minimum(np.abs(x).astype(np.float64), 6.0)
    d = np.abs(a[..., None] - E2M1.astype(np.float64))
    cand = d == d.min(-1, keepdims=True)
    # of two equally near codes, the even one
    idx = np.where(cand[..., ::2].any(-1), np.argmax(cand & (np.arange(8) % 2 == 0), -1), np.argmax(cand, -1))
    return (idx | np.where(np.signbit(x), 8, 0)).astype(np.uint8)


def fp4_quantize(d, mode, ref):
    """Quantize every projection of checkpoint d to packed 4-bit in place,
    as 4-bit checkpoints store them (E2M1 codes two to a byte, the low
    nibble first); ref gets the dequantized values:
      "modelopt":   NAME U8 [R, C/2], NAME_scale F8_E4M3 [R, C/16], NAME_scale_2 F32
                    (value = code * (scale * scale_2)), hf_quant_config.json NVFP4;
      "compressed": NAME_packed, NAME_scale F8_E4M3, NAME_global_scale F32
                    (value = code * (scale / global_scale)), compressed-tensors;
      "mxfp4":      NAME U8 [R, C/2], NAME_scale U8 (E8M0) [R, C/32]
                    (value = code * 2^(scale - 127))."""
    from qwen3next_ref import e4m3_decode, e4m3_encode

    def one(name, w):
        R, C = w.shape
        out = {}
        if mode == "mxfp4":
            g = 32
            amax = np.abs(w.reshape(R, C // g, g)).max(-1)
            # the smallest power of two that takes the block's absmax to <= 6
            e = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), 0)
            sc_code = np.clip(e + 127, 1, 254).astype(np.uint8)
            eff = np.exp2(sc_code.astype(np.float64) - 127).astype(np.float32)
            out[name + "_scale"] = ("U8", [R, C // g], sc_code.tobytes())
        else:
            g = 16
            amax = np.float32(np.abs(w).max())
            s2 = np.float32(amax / np.float32(6 * 448)) if amax > 0 else np.float32(1)
            bmax = np.abs(w.reshape(R, C // g, g)).max(-1).astype(np.float32)
            sc_code = e4m3_encode(np.divide(bmax / np.float32(6), s2, dtype=np.float32))
            sf = e4m3_decode(sc_code).astype(np.float32)
            out[name + "_scale"] = ("F8_E4M3", [R, C // g], sc_code.tobytes())
            if mode == "modelopt":
                eff = (sf * s2).astype(np.float32)
                out[name + "_scale_2"] = ("F32", [], np.float32(s2).tobytes())
                out[name[:-len(".weight")] + ".input_scale"] = ("F32", [], np.float32(1.0).tobytes())
            else:
                gs = np.float32(np.float32(1) / s2)
                eff = np.divide(sf, gs, dtype=np.float32)
                out[name + "_global_scale"] = ("F32", [1], np.array([gs], dtype="<f4").tobytes())
        full = np.repeat(eff, g, 1)
        codes = np.where(full > 0, e2m1_encode(np.divide(w, np.where(full > 0, full, 1), dtype=np.float32)), 0)
        codes = codes.astype(np.uint8)
        vals = (E2M1[codes & 7] * np.where(codes & 8, -1, 1)).astype(np.float32) * full
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        out[name + ("_packed" if mode == "compressed" else "")] = ("U8", [R, C // 2], packed.tobytes())
        return out, vals

    if mode == "modelopt":
        quantize_checkpoint(d, ref, one, None, {"hf_quant_config.json": {
            "producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8"}}})
    elif mode == "compressed":
        quantize_checkpoint(d, ref, one, {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}})
    else:
        quantize_checkpoint(d, ref, one, {"quant_method": "quark", "quant_algo": "MXFP4"})


def quantize_checkpoint(d, ref, one, quant_config, extra_files=None):
    """Replace every projection (2-D, not the embeddings, the output or the
    routers, as quantized checkpoints leave them) of checkpoint d in place by
    the tensors one(name, float32 values) returns with the values they
    stand for; each shard keeps its own. quant_config goes into config.json,
    extra_files (name: JSON) beside it. ref gets one file of the checkpoint's
    values: the dequantized ones in F32, the rest as they were."""
    import shutil
    index = f"{d}/model.safetensors.index.json"
    ix = json.load(open(index)) if os.path.exists(index) else None
    files = sorted(set(ix["weight_map"].values())) if ix else ["model.safetensors"]
    deq = {}
    for f in files:
        out = {}
        for name, (dt, shape, data) in read(f"{d}/{f}").items():
            if not (len(shape) == 2 and name.endswith(".weight") and "embed_tokens" not in name and
                    not name.startswith(("lm_head", "mtp")) and "visual" not in name and
                    not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))):
                out[name] = deq[name] = (dt, shape, data)
                continue
            tensors, vals = one(name, bf16_values(data, shape))
            out.update(tensors)
            deq[name] = ("F32", shape, vals.astype("<f4").tobytes())
            if ix:
                ix["weight_map"].pop(name, None)
        if ix:
            ix["weight_map"].update({n: f for n in out})
        write(f"{d}/{f}", out)
    if ix:
        json.dump(ix, open(index, "w"))
    if quant_config:
        edit_config(d, lambda c: c.update(quantization_config=quant_config))
    for name, value in (extra_files or {}).items():
        json.dump(value, open(f"{d}/{name}", "w"), indent=2)
    os.makedirs(ref, exist_ok=True)
    write(f"{ref}/model.safetensors", deq)
    shutil.copy(f"{d}/config.json", f"{ref}/config.json")
    edit_config(ref, lambda c: c.pop("quantization_config", None))


def values(dt, shape, data):
    """A float tensor's values as float32 (BF16 and F32)."""
    if dt == "BF16":
        return bf16_values(data, shape)
    if dt == "F32":
        return np.frombuffer(data, dtype="<f4").reshape(shape)
    raise SystemExit(f"values: {dt} is not a float dtype this helper reads")


def bf16_values(data, shape):
    return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view("<f4").reshape(shape)


def edit_config(d, change):
    c = json.load(open(f"{d}/config.json"))
    change(c)
    json.dump(c, open(f"{d}/config.json", "w"), indent=2)


def qwen35(src, dst, shards):
    """Rewrite src (kvdrift export: Qwen3-Next names, fused Gated DeltaNet
    projections) as a multimodal Qwen3.5 checkpoint: the config's fields in
    text_config (RoPE in rope_parameters, with the mRoPE keys), the language
    model under model.language_model., vision and MTP tensors beside it, the
    projections split into in_proj_qkv / in_proj_z / in_proj_b / in_proj_a,
    spread over `shards` files with an index. The split follows Qwen3-Next's
    fix_query_key_value_ordering: in_proj_qkvz rows are, per key head,
    q (dk) | k (dk) | v (r dv) | z (r dv); in_proj_ba rows b (r) | a (r)."""
    import os
    cfg = json.load(open(f"{src}/config.json"))
    t = read(f"{src}/model.safetensors")
    H, nk, nv = cfg["hidden_size"], cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], nv // nk

    def rows(name, n):
        dt, shape, data = t[name]
        assert dt == "BF16" and shape[1] == H
        return np.frombuffer(data, dtype="<u2").reshape(nk, n, H)

    out = {}
    for name, v in t.items():
        if name.endswith("in_proj_qkvz.weight"):
            x = rows(name, 2 * dk + 2 * r * dv)
            q, k = x[:, :dk], x[:, dk:2 * dk]
            vv, z = x[:, 2 * dk:2 * dk + r * dv], x[:, 2 * dk + r * dv:]
            qkv = np.concatenate([q.reshape(-1, H), k.reshape(-1, H), vv.reshape(-1, H)])
            base = name[:-len("in_proj_qkvz.weight")]
            out[base + "in_proj_qkv.weight"] = ("BF16", list(qkv.shape), qkv.tobytes())
            out[base + "in_proj_z.weight"] = ("BF16", [nv * dv, H], z.reshape(-1, H).tobytes())
        elif name.endswith("in_proj_ba.weight"):
            x = rows(name, 2 * r)
            base = name[:-len("in_proj_ba.weight")]
            out[base + "in_proj_b.weight"] = ("BF16", [nv, H], x[:, :r].reshape(-1, H).tobytes())
            out[base + "in_proj_a.weight"] = ("BF16", [nv, H], x[:, r:].reshape(-1, H).tobytes())
        else:
            out[name] = v
    out = {(n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n): v
           for n, v in out.items()}
    out["model.visual.patch_embed.proj.weight"] = ("BF16", [8, 3], bytes(48))
    out["mtp.fc.weight"] = ("BF16", [H, 2 * H], bytes(4 * H * H))
    text = dict(cfg, model_type="qwen3_5_moe_text",
                rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                 "partial_rotary_factor": cfg["partial_rotary_factor"],
                                 "mrope_interleaved": True, "mrope_section": [11, 11, 10]})
    for k in ("rope_theta", "partial_rotary_factor", "architectures", "mlp_only_layers",
              "decoder_sparse_step", "norm_topk_prob", "tie_word_embeddings"):
        text.pop(k, None)
    os.makedirs(dst, exist_ok=True)
    json.dump({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
               "tie_word_embeddings": False, "text_config": text,
               "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1}},
              open(f"{dst}/config.json", "w"), indent=2)
    names = sorted(out)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        f = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write(f"{dst}/{f}", {n: out[n] for n in part})
        weight_map.update({n: f for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(f"{dst}/model.safetensors.index.json", "w"))


if __name__ == "__main__":
    main()
