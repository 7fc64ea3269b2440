"""Test helper: read and write safetensors files with only the standard
library and numpy, to build checkpoints kvdrift must load or refuse."""
import json
import struct
import sys

import numpy as np


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
    if cmd == "add-scales":  # DIR LAYER:K:V ... -> kv_scales.safetensors + index
        d = sys.argv[2]
        scales = {}
        for spec in sys.argv[3:]:
            layer, k, v = spec.split(":")
            scales[f"model.layers.{layer}.self_attn.k_proj.k_scale"] = f32(float(k))
            scales[f"model.layers.{layer}.self_attn.v_proj.v_scale"] = f32(float(v))
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
    """Quantize every projection of checkpoint d (not the embeddings, the
    output or the routers) to E4M3 in place, as FP8
    checkpoints store them: mode "block64" (NAME_scale_inv, one scale per
    64 x 64 block, quantization_config.weight_block_size), "channel"
    (NAME_scale [rows, 1]) or "tensor" (NAME_scale, one value); scale =
    absmax / 448 of what it covers. Write to ref the same checkpoint with the
    dequantized values (code * scale, in float32) as F32 tensors, in one
    file. A sharded checkpoint keeps each scale in its weight's shard."""
    import os
    import shutil
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
    from qwen3next_ref import e4m3_decode, e4m3_encode
    index = f"{d}/model.safetensors.index.json"
    ix = json.load(open(index)) if os.path.exists(index) else None
    files = sorted(set(ix["weight_map"].values())) if ix else ["model.safetensors"]
    deq = {}
    for f in files:
        t = read(f"{d}/{f}")
        out = quantize_file(t, mode, deq, e4m3_encode, e4m3_decode)
        write(f"{d}/{f}", out)
        if ix:
            ix["weight_map"].update({n: f for n in out})
    if ix:
        json.dump(ix, open(index, "w"))
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    if mode == "block64":
        qc["weight_block_size"] = [64, 64]
    edit_config(d, lambda c: c.update(quantization_config=qc))
    os.makedirs(ref, exist_ok=True)
    write(f"{ref}/model.safetensors", deq)
    shutil.copy(f"{d}/config.json", f"{ref}/config.json")
    edit_config(ref, lambda c: c.pop("quantization_config"))


def quantize_file(t, mode, deq, e4m3_encode, e4m3_decode):
    out = {}
    for name, (dt, shape, data) in t.items():
        out[name] = deq[name] = (dt, shape, data)
        # every 2-D projection; the embeddings, the output and the routers
        # stay as they are, as in FP8 checkpoints
        if (len(shape) != 2 or not name.endswith(".weight") or "embed_tokens" in name or
                name.startswith("lm_head") or name.endswith("mlp.gate.weight") or
                name.endswith("shared_expert_gate.weight") or "visual" in name or name.startswith("mtp")):
            continue
        w = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view("<f4").reshape(shape)
        R, C = shape
        if mode == "block64":
            B = 64
            sc = np.ones(((R + B - 1) // B, (C + B - 1) // B), dtype=np.float32)
            for i in range(sc.shape[0]):
                for j in range(sc.shape[1]):
                    m = np.abs(w[i * B:(i + 1) * B, j * B:(j + 1) * B]).max()
                    sc[i, j] = m / np.float32(448) if m > 0 else 1
            full = np.repeat(np.repeat(sc, B, 0), B, 1)[:R, :C]
            sname = name + "_scale_inv"
        elif mode == "channel":
            m = np.abs(w).max(1, keepdims=True)
            sc = np.where(m > 0, m / np.float32(448), 1).astype(np.float32)
            full = np.broadcast_to(sc, (R, C))
            sname = name + "_scale"
        else:
            m = np.abs(w).max()
            sc = np.array(m / np.float32(448) if m > 0 else 1, dtype=np.float32)
            full = np.broadcast_to(sc, (R, C))
            sname = name + "_scale"
        codes = e4m3_encode(np.divide(w, full, dtype=np.float32))
        vals = e4m3_decode(codes).astype(np.float32) * full.astype(np.float32)
        out[name] = ("F8_E4M3", shape, codes.tobytes())
        out[sname] = ("F32", list(sc.shape), sc.tobytes())
        deq[name] = ("F32", shape, vals.astype("<f4").tobytes())
    return out


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
