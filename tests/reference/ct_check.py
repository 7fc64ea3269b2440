"""kvdrift's dequantized weights against compressed-tensors' own
dequantization (the library vLLM loads quantized checkpoints with): every
FP8 or packed 4-bit weight of CKPT, dequantized by compressed-tensors in
float32, must equal bit for bit the tensor `kvdrift export --dtype f32` wrote
from the same checkpoint.
  - FP8 E4M3 with NAME_scale or NAME_scale_inv: per tensor, per row
    (strategy "channel") or per block of quantization_config.weight_block_size;
  - NVFP4 (E2M1 codes, an E4M3 scale per 16, over NAME_global_scale) and
    MXFP4 (an E8M0 scale per 32);
  - ModelOpt's NVFP4 (NAME_scale_2) is read as compressed-tensors' own
    ModelOpt converter reads it, global scale = 1 / scale_2, which rounds
    once more than the multiplication ModelOpt defines: within 1e-6.
usage: ct_check.py CKPT_DIR KVDRIFT_F32_EXPORT.safetensors"""
import glob
import json
import sys

import torch
from compressed_tensors.compressors.mx_utils import decompress_mx_scale
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import dequantize
from safetensors.torch import load_file

from checks import Checks


def fp8_args(scale, shape, block):
    if scale.numel() == 1:
        return QuantizationArgs(num_bits=8, type="float", strategy="tensor")
    if tuple(scale.shape) in ((shape[0], 1), (shape[0],)):
        return QuantizationArgs(num_bits=8, type="float", strategy="channel")
    return QuantizationArgs(num_bits=8, type="float", strategy="block", block_structure=block)


def main():
    ckpt, export = sys.argv[1], sys.argv[2]
    t = {}
    for f in sorted(glob.glob(f"{ckpt}/*.safetensors")):
        t.update(load_file(f))
    qc = json.load(open(f"{ckpt}/config.json")).get("quantization_config") or {}
    block = qc.get("weight_block_size", [128, 128])
    ours = load_file(export)
    check = Checks()
    n = {"FP8": 0, "NVFP4": 0, "MXFP4": 0}
    modelopt = False
    for name, w in t.items():
        if not name.endswith((".weight", ".weight_packed")):
            continue
        base = name[: name.rindex(".weight")]
        gs = None
        if w.dtype == torch.float8_e4m3fn:
            kind = "FP8"
            scale = t.get(f"{name}_scale", t.get(f"{name}_scale_inv")).to(torch.float32)
            x, args = w.to(torch.float32), fp8_args(scale, w.shape, block)
            if args.strategy == "channel":
                scale = scale.reshape(-1, 1)
        elif w.dtype == torch.uint8:
            scale = t[f"{base}.weight_scale"]
            m, k = w.shape
            x = unpack_fp4_from_uint8(w, m, 2 * k, dtype=torch.float32)
            if scale.dtype == torch.uint8:  # MXFP4: E8M0 exponents, one per 32 values
                kind = "MXFP4"
                args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32)
                scale = decompress_mx_scale(scale).to(torch.float32)
            else:  # NVFP4: E4M3 per 16 values, over the global scale
                kind = "NVFP4"
                gs = t.get(f"{base}.weight_global_scale")
                if gs is None:
                    modelopt = True
                    gs = 1 / t[f"{base}.weight_scale_2"].reshape(1)
                args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16)
                scale = scale.to(torch.float32)
        else:
            continue
        ref = dequantize(x_q=x, scale=scale, args=args, global_scale=gs, dtype=torch.float32)
        got = ours[f"{base}.weight"]
        n[kind] += 1
        same = torch.allclose(ref, got, rtol=1e-6, atol=0) if modelopt else torch.equal(ref, got)
        if not same:
            bad = (ref != got).sum().item()
            check(False, f"{base}.weight ({kind}): {bad} of {ref.numel()} values differ from "
                  "compressed-tensors'")
    check(sum(n.values()) > 0 and not check.failures,
          ", ".join(f"{v} {k}" for k, v in n.items() if v) + " tensors equal to compressed-tensors' "
          "dequantization" + (" (within 1e-6: ModelOpt's scale_2)" if modelopt else " bit for bit"))
    sys.exit(check.finish(ckpt))


if __name__ == "__main__":
    main()
