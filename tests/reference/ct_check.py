"""kvdrift's dequantized 4-bit weights against compressed-tensors' own
NVFP4 / MXFP4 decompression (the library vLLM loads such checkpoints with):
every packed tensor of CKPT, unpacked and dequantized by compressed-tensors
in float32, must equal bit for bit the tensor `kvdrift export --dtype f32`
wrote from the same checkpoint. ModelOpt's NVFP4 is read as compressed-tensors'
own ModelOpt converter reads it (global scale = 1 / weight_scale_2), which
rounds once more than the multiplication ModelOpt defines: within 1e-6.
usage: ct_check.py CKPT_DIR KVDRIFT_F32_EXPORT.safetensors"""
import glob
import sys

import torch
from compressed_tensors.compressors.mx_utils import decompress_mx_scale
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import dequantize
from safetensors.torch import load_file

from checks import Checks


def main():
    ckpt, export = sys.argv[1], sys.argv[2]
    t = {}
    for f in sorted(glob.glob(f"{ckpt}/*.safetensors")):
        t.update(load_file(f))
    ours = load_file(export)
    check = Checks()
    n = {"NVFP4": 0, "MXFP4": 0}
    for name, packed in t.items():
        if packed.dtype != torch.uint8 or not name.endswith((".weight", ".weight_packed")):
            continue
        base = name[: name.rindex(".weight")]
        scale = t[f"{base}.weight_scale"]
        m, k = packed.shape
        x = unpack_fp4_from_uint8(packed, m, 2 * k, dtype=torch.float32)
        if scale.dtype == torch.uint8:  # MXFP4: E8M0 exponents, one per 32 values
            kind, gs = "MXFP4", None
            args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32)
            sf = decompress_mx_scale(scale).to(torch.float32)
        else:  # NVFP4: E4M3 per 16 values, over the global scale
            kind = "NVFP4"
            gs = t.get(f"{base}.weight_global_scale")
            if gs is None:
                gs = 1 / t[f"{base}.weight_scale_2"].reshape(1)
            args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16)
            sf = scale.to(torch.float32)
        ref = dequantize(x_q=x, scale=sf, args=args, global_scale=gs, dtype=torch.float32)
        got = ours[f"{base}.weight"]
        n[kind] += 1
        modelopt = f"{base}.weight_scale_2" in t
        same = torch.allclose(ref, got, rtol=1e-6, atol=0) if modelopt else torch.equal(ref, got)
        if not same:
            bad = (ref != got).sum().item()
            check(False, f"{base}.weight ({kind}): {bad} of {ref.numel()} values differ from "
                  "compressed-tensors'")
    check(sum(n.values()) > 0 and not check.failures,
          f"{n['NVFP4']} NVFP4 and {n['MXFP4']} MXFP4 tensors equal to compressed-tensors' "
          "dequantization" + (" (within 1e-6: ModelOpt's scale_2)" if modelopt else " bit for bit"))
    sys.exit(check.finish(ckpt))


if __name__ == "__main__":
    main()
