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
    elif cmd == "fp8-weight":  # FILE NAME: re-type one weight as F8_E4M3 (half the bytes)
        t = read(sys.argv[2])
        dt, shape, data = t[sys.argv[3]]
        t[sys.argv[3]] = ("F8_E4M3", shape, data[: len(data) // 2])
        write(sys.argv[2], t)
    elif cmd == "retype":  # FILE F32|F16: every BF16 tensor re-stored in another float dtype
        t = read(sys.argv[2])
        to = sys.argv[3]
        for name, (dt, shape, data) in list(t.items()):
            if dt != "BF16":
                continue
            f = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view("<f4")
            t[name] = (to, shape, f.astype("<f4" if to == "F32" else "<f2").tobytes())
        write(sys.argv[2], t)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
