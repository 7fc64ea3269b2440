"""Independent NumPy reference of the Qwen3-Next hybrid decoder.

Written from the model's definition (Hugging Face transformers'
modeling_qwen3_next.py and the Gated DeltaNet paper), not from kvdrift's C:
it reads a Hugging Face checkpoint directory (config.json + safetensors) and
computes the whole sequence at once in float64, with the KV cache's storage
precision (BF16 rounding or FP8 E4M3 quantize/dequantize) applied to K and V
exactly where an engine applies it.
"""
import json
import os

import numpy as np


# ---- safetensors ----

def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        buf = raw[base + a:base + b]
        if meta["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif meta["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {meta['dtype']} not handled")
        out[name] = arr.reshape(meta["shape"]).astype(np.float64)
    return out


# ---- number formats ----

def round_bf16(x):
    """float32 -> nearest BF16 (ties to even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def e4m3_encode(x):
    """float32 -> E4M3 codes, round to nearest even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    sign = (np.signbit(x)).astype(np.uint8) << 7
    a = np.abs(x)
    _, e2 = np.frexp(np.where(a > 0, a, 1.0))
    step = np.exp2(np.maximum(e2 - 1 - 3, -9).astype(np.float64))
    q = np.rint(a / step) * step  # numpy rint rounds half to even
    q = np.minimum(q, 448.0)
    code = np.zeros(x.shape, dtype=np.uint8)
    sub = q < 2.0 ** -6
    code[sub] = (q[sub] / 2.0 ** -9).astype(np.uint8)
    nq = q[~sub]
    _, e = np.frexp(nq)
    E = e - 1
    mant = (nq / np.exp2(E.astype(np.float64)) - 1.0) * 8
    code[~sub] = (((E + 7) << 3) + mant.astype(np.int64)).astype(np.uint8)
    return code | sign


def e4m3_decode(c):
    c = np.asarray(c, dtype=np.uint8)
    e = (c >> 3) & 15
    m = (c & 7).astype(np.float64)
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * np.exp2(e.astype(np.float64) - 7))
    return np.where(c & 0x80, -v, v)


E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_encode(y):
    """float32 -> E2M1 codes (low four bits): the nearest grid value, a tie
    to the even code, beyond 6 clamped to 6."""
    y = np.asarray(y, dtype=np.float32).astype(np.float64)
    a = np.minimum(np.abs(y), 6.0)
    i = np.clip(np.searchsorted(E2M1_GRID, a, side="right") - 1, 0, 6)
    lo, hi = E2M1_GRID[i], E2M1_GRID[i + 1]
    up = (a - lo > hi - a) | ((a - lo == hi - a) & ((i + 1) % 2 == 0))
    code = np.where(up, i + 1, i).astype(np.uint8)
    return code | (np.signbit(y).astype(np.uint8) << 3)


def nvfp4_encode(x32, s):
    """NVFP4 rows of x32 ([..., head_dim] float32) under global scales s
    (broadcast over the rows): the stored bytes ([..., head_dim / 2 + head_dim
    / 16]: the codes two to a byte, low first, then the groups' E4M3 block
    scales) and the values they read back as (float64)."""
    x32 = np.asarray(x32, dtype=np.float32)
    s = np.asarray(s, dtype=np.float32)[..., None]
    hd = x32.shape[-1]
    g = x32.reshape(x32.shape[:-1] + (hd // 16, 16))
    a = np.abs(g).max(-1)
    sf = e4m3_encode(np.divide(np.divide(a, np.float32(6.0), dtype=np.float32), s, dtype=np.float32))
    d = (e4m3_decode(sf).astype(np.float32) * s).astype(np.float32)
    dd = np.broadcast_to(d[..., None], g.shape)
    y = np.where(dd > 0, np.divide(g, np.where(dd > 0, dd, 1), dtype=np.float32), g * np.float32(0))
    codes = e2m1_encode(y).reshape(x32.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    mag = E2M1_GRID[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    vals = (mag.reshape(g.shape) * e4m3_decode(sf)[..., None]).reshape(x32.shape) * s.astype(np.float64)
    return np.concatenate([packed, sf], -1), vals


def nvfp4_decode(row, s):
    """Stored NVFP4 rows back to values (float64)."""
    row = np.asarray(row, dtype=np.uint8)
    hd = row.shape[-1] * 16 // 9
    codes = np.stack([row[..., :hd // 2] & 15, row[..., :hd // 2] >> 4], -1).reshape(row.shape[:-1] + (hd,))
    mag = E2M1_GRID[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    sf = np.repeat(e4m3_decode(row[..., hd // 2:]), 16, -1)
    return mag * sf * np.asarray(s, dtype=np.float32)[..., None].astype(np.float64)


def e4m3t_encode(x32):
    """E4M3 rows of x32 ([..., head_dim] float32), each with its own scale
    (fp8-token, vLLM's fp8_per_token_head): s = max(absmax / 448, 1e-6) in
    float32 and the codes of x times 1 / s. The stored bytes ([..., head_dim
    + 4]: the codes, then s as a little-endian float32) and the values they
    read back as (float64)."""
    x32 = np.asarray(x32, dtype=np.float32)
    a = np.abs(x32).max(-1, keepdims=True)
    s = np.maximum(np.divide(a, np.float32(448.0), dtype=np.float32), np.float32(1e-6))
    inv = np.divide(np.float32(1.0), s, dtype=np.float32)
    codes = e4m3_encode(np.multiply(x32, inv, dtype=np.float32))
    sb = np.ascontiguousarray(s.astype("<f4")).view(np.uint8)
    return np.concatenate([codes, sb], -1), e4m3_decode(codes) * s.astype(np.float64)


def i8t_encode(x32, rn=False):
    """INT8 rows of x32 ([..., head_dim] float32), each with its own scale
    (int8-token, vLLM's int8_per_token_head): s = max(absmax / 127, 1e-6) in
    float32 and x times 1 / s clamped to [-128, 127], truncated toward zero
    (a float stored to an int8 pointer in Triton); rn: rounded to nearest
    even instead (int8-token-rn). The stored bytes (the codes, then s as a
    little-endian float32) and the values (float64)."""
    x32 = np.asarray(x32, dtype=np.float32)
    a = np.abs(x32).max(-1, keepdims=True)
    s = np.maximum(np.divide(a, np.float32(127.0), dtype=np.float32), np.float32(1e-6))
    inv = np.divide(np.float32(1.0), s, dtype=np.float32)
    y = np.clip(np.multiply(x32, inv, dtype=np.float32), -128, 127)
    q = (np.rint(y) if rn else np.trunc(y)).astype(np.int8)
    sb = np.ascontiguousarray(s.astype("<f4")).view(np.uint8)
    return np.concatenate([q.view(np.uint8), sb], -1), q.astype(np.float64) * s.astype(np.float64)


def i8t_decode(row):
    """Stored int8-token rows back to values (float64)."""
    row = np.asarray(row, dtype=np.uint8)
    hd = row.shape[-1] - 4
    s = np.ascontiguousarray(row[..., hd:]).view("<f4")
    return row[..., :hd].view(np.int8).astype(np.float64) * s.astype(np.float64)


def rht_signs(n):
    """The +-1 signs of int4-token's rotation: bit 23 of each of the first n
    outputs of MT19937 seeded 0x9E3779B9 (NumPy's legacy RandomState seeds
    it as torch's CPU generator does; torch.bernoulli(0.5) takes the bit)."""
    raw = np.random.RandomState(0x9E3779B9)._bit_generator.random_raw(n)
    return np.where((raw >> 23) & 1, -1.0, 1.0).astype(np.float32)


def rht(x32, inverse=False):
    """The randomized Hadamard transform of rows of x32 ([..., n], n a power
    of two) in float32 as the engine's butterfly computes it: forward
    H (d * x), inverse d * (H x), H unnormalized (at stride h = 1, 2, 4,
    ...: a + b and a - b)."""
    x = np.array(x32, dtype=np.float32)
    n = x.shape[-1]
    d = rht_signs(n)
    if not inverse:
        x = x * d
    h = 1
    while h < n:
        v = x.reshape(x.shape[:-1] + (n // (2 * h), 2, h))
        a, b = v[..., 0, :], v[..., 1, :]
        x = np.stack([a + b, a - b], axis=-2).reshape(x.shape)
        h *= 2
    return x * d if inverse else x


def round_away(v):
    """float32 v to an integer as (int)(v + 0.5) or (int)(v - 0.5) by its
    sign, the additions in float32."""
    v = np.asarray(v, dtype=np.float32)
    return np.where(v >= 0, np.trunc(v + np.float32(0.5)), np.trunc(v - np.float32(0.5)))


def i4t_encode(x32):
    """INT4 rows of x32 ([..., head_dim] float32) with a zero point and a
    scale each (int4-token, vLLM's int4_per_token_head): y = bf16(rht(x)),
    s = max((max - min) / 15, 1e-6), z = clamp(round(-min / s), 0, 15),
    code = clamp(round(y * (1 / s) + z), 0, 15) (the product and sum rounded
    once, as a fused multiply-add), halves away from zero. The stored bytes
    (two codes a byte, low nibble first, then s as float32 with z in its four
    low bits) and the values in the rotated basis, (code - z) s' with s' the
    stored scale less z (float64)."""
    y = round_bf16(rht(np.asarray(x32, dtype=np.float32)))
    lo, hi = y.min(-1, keepdims=True), y.max(-1, keepdims=True)
    s = np.maximum(np.divide(hi - lo, np.float32(15.0), dtype=np.float32), np.float32(1e-6))
    inv = np.divide(np.float32(1.0), s, dtype=np.float32)
    z = np.clip(round_away(np.divide(-lo, s, dtype=np.float32)), 0, 15)
    v = (y.astype(np.float64) * inv.astype(np.float64) + z).astype(np.float32)
    q = np.clip(round_away(v), 0, 15).astype(np.uint8)
    bits = (np.ascontiguousarray(s).view(np.uint32) & np.uint32(0xFFFFFFF0)) | z.astype(np.uint32)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    sb = np.ascontiguousarray(bits.astype("<u4")).view(np.uint8)
    return np.concatenate([packed, sb], -1), i4t_decode(np.concatenate([packed, sb], -1))


def i4t_decode(row):
    """Stored int4-token rows back to values in the rotated basis
    (float64)."""
    row = np.asarray(row, dtype=np.uint8)
    nb = row.shape[-1] - 4
    bits = np.ascontiguousarray(row[..., nb:]).view("<u4")
    z = (bits & 15).astype(np.float64)
    s = (bits & np.uint32(0xFFFFFFF0)).view("<f4").astype(np.float64)
    q = np.empty(row.shape[:-1] + (2 * nb,), dtype=np.float64)
    q[..., 0::2], q[..., 1::2] = row[..., :nb] & 15, row[..., :nb] >> 4
    return (q - z) * s


def i4t_attention(q, kq, vq):
    """Attention over int4-token rows (kq, vq: the rotated basis): the query
    rotated as the rows were and rounded to BF16, the softmax scale over
    head_dim (the rotation's gain, squared), the output rotated back over
    head_dim and rounded to BF16."""
    hd = q.shape[-1]
    qr = round_bf16(rht(q.astype(np.float32))).astype(np.float64) / hd
    p, o = fp8_attention(qr, kq, vq)
    return p, round_bf16(rht(o.astype(np.float32), True) / np.float32(hd)).astype(np.float64)


def e4m3t_decode(row):
    """Stored fp8-token rows back to values (float64)."""
    row = np.asarray(row, dtype=np.uint8)
    hd = row.shape[-1] - 4
    s = np.ascontiguousarray(row[..., hd:]).view("<f4")
    return e4m3_decode(row[..., :hd]) * s.astype(np.float64)


def fp8_attention(q, kq, vq, qs=None, p_fp8=False):
    """Causal attention of every position, [T, heads, hd] in: the
    distribution P [heads, T, T] and the output [T, heads, hd]. With FP8
    attention (FlashAttention 3 over an FP8 cache): the query through E4M3
    with per-head scales qs, and the weights 2^8 exp(s - max) rounded to
    E4M3 for the sum of V, normalised by the unrounded weights' sum."""
    if qs is not None:
        q = store(q, "fp8", qs)[0]
    T, nh, hd = q.shape
    grp = nh // kq.shape[1]
    kr, vr = np.repeat(kq, grp, axis=1), np.repeat(vq, grp, axis=1)
    s = np.einsum("thd,uhd->htu", q, kr) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    total = e.sum(-1, keepdims=True)
    w = e4m3_decode(e4m3_encode((256.0 * e).astype(np.float32))) / 256.0 if p_fp8 else e
    return e / total, np.einsum("htu,uhd->thd", w / total, vr)


def store(x, mode, scale):
    """What the cache holds and gives back for x ([..., head_dim], float64),
    with per-KV-head scales, and the stored codes (None for BF16)."""
    x32 = x.astype(np.float32)
    if mode == "bf16":
        return round_bf16(x32).astype(np.float64), None
    if mode == "nvfp4":
        codes, vals = nvfp4_encode(x32, scale)
        return vals, codes
    if mode in ("e4m3t", "i8t", "i8t-rn", "i4t"):  # each row its own scale; scale is not used
        codes, vals = (e4m3t_encode(x32) if mode == "e4m3t" else i4t_encode(x32) if mode == "i4t"
                       else i8t_encode(x32, mode == "i8t-rn"))
        return vals, codes
    s = np.asarray(scale, dtype=np.float32)[:, None]
    codes = e4m3_encode(np.divide(x32, s, dtype=np.float32))
    return e4m3_decode(codes) * s.astype(np.float64), codes


# ---- the model ----

def rms_norm(x, w, eps, one_plus):
    r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return r * ((1.0 + w) if one_plus else w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def rope(x, pos, rot, theta):
    """rotate-half RoPE on the first rot dims of x [T, heads, head_dim]."""
    inv = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = pos[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    xr, xp = x[..., :rot], x[..., rot:]
    h = rot // 2
    rh = np.concatenate([-xr[..., h:], xr[..., :h]], -1)
    return np.concatenate([xr * cos + rh * sin, xp], -1)


class Qwen3NextRef:
    def __init__(self, ckpt):
        with open(os.path.join(ckpt, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = load_safetensors(os.path.join(ckpt, "model.safetensors"))
        # when a dict, forward fills it: "hidden", the residual stream after
        # every layer; "experts", every layer's routed experts (sorted);
        # "attn", per full-attention layer the query after RoPE, K and V
        # before the cache and as the cache gives them back
        self.record = None

    def forward(self, tokens, kv_mode="bf16", scales=None, cache_codes=None, attn_fp8=False):
        """Logits [T, vocab] and, per full-attention layer, (K, V, K codes,
        V codes) with K/V as computed before the cache stored them.

        cache_codes, when given ({layer: (K codes, V codes)}), makes attention
        read those stored codes instead of this model's own: one flipped code
        upstream (a value a float32 ulp from a rounding midpoint) changes a
        value by an FP8 step, and everything above would inherit that. With
        the same cache, the layers above are comparable to float noise again,
        while this model still reports the codes it would have written.

        attn_fp8: FP8 attention for the E4M3 modes (fp8_attention), with
        fp8-cal's query scales from scales["q"] (per layer, per query head)
        and 1.0 for fp8-unscaled."""
        c, W = self.cfg, self.w
        T = len(tokens)
        eps = c["rms_norm_eps"]
        pos = np.arange(T, dtype=np.float64)
        x = W["model.embed_tokens.weight"][tokens]
        caches = []
        for i, kind in enumerate(c["layer_types"]):
            p = f"model.layers.{i}."
            xn = rms_norm(x, W[p + "input_layernorm.weight"], eps, True)
            if kind == "full_attention":
                al = len(caches)
                sc = None if scales is None else (scales["k"][al], scales["v"][al])
                forced = None if cache_codes is None else cache_codes.get(al)
                qs = None
                if attn_fp8 and kv_mode in ("fp8-cal", "fp8-unscaled"):
                    qs = scales["q"][al] if kv_mode == "fp8-cal" else np.ones(c["num_attention_heads"])
                mix, kvrec = self.attention(xn, p, pos, kv_mode, sc, forced, qs)
                caches.append(kvrec)
            else:
                mix = self.deltanet(xn, p)
            h = x + mix
            hn = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps, True)
            x = h + self.moe(hn, p)
            if self.record is not None:
                self.record.setdefault("hidden", []).append(x)
        x = rms_norm(x, W["model.norm.weight"], eps, True)
        return x @ W["lm_head.weight"].T, caches

    def attention(self, xn, p, pos, kv_mode, sc, forced=None, qs=None):
        c, W = self.cfg, self.w
        T = xn.shape[0]
        nh, kvh, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        rot = int(hd * c["partial_rotary_factor"])
        eps = c["rms_norm_eps"]
        qg = (xn @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        k = (xn @ W[p + "self_attn.k_proj.weight"].T).reshape(T, kvh, hd)
        v = (xn @ W[p + "self_attn.v_proj.weight"].T).reshape(T, kvh, hd)
        q = rope(rms_norm(q, W[p + "self_attn.q_norm.weight"], eps, True), pos, rot, c["rope_theta"])
        k = rope(rms_norm(k, W[p + "self_attn.k_norm.weight"], eps, True), pos, rot, c["rope_theta"])
        if kv_mode in ("fp8-unscaled", "nvfp4-unscaled"):
            ks = vs = np.ones(kvh, dtype=np.float32)
        elif kv_mode == "fp8-cal":
            ks, vs = sc
        elif kv_mode == "nvfp4-cal":  # the FP8 scales over E2M1's 6
            ks, vs = (np.divide(np.asarray(t, dtype=np.float32), np.float32(6.0), dtype=np.float32) for t in sc)
        else:
            ks = vs = None
        mode = ("bf16" if kv_mode == "bf16" else "nvfp4" if kv_mode.startswith("nvfp4")
                else "e4m3t" if kv_mode == "fp8-token" else "i8t" if kv_mode == "int8-token"
                else "i8t-rn" if kv_mode == "int8-token-rn" else "i4t" if kv_mode == "int4-token"
                else "fp8")
        kq, kc = store(k, mode, ks)
        vq, vc = store(v, mode, vs)
        if forced is not None and mode == "nvfp4":
            kq, vq = nvfp4_decode(forced[0], ks), nvfp4_decode(forced[1], vs)
        if forced is not None and mode in ("e4m3t", "i8t", "i8t-rn", "i4t"):
            dec = e4m3t_decode if mode == "e4m3t" else i4t_decode if mode == "i4t" else i8t_decode
            kq, vq = dec(forced[0]), dec(forced[1])
        if forced is not None and mode == "fp8":
            kq = e4m3_decode(forced[0]) * np.asarray(ks, dtype=np.float32)[:, None].astype(np.float64)
            vq = e4m3_decode(forced[1]) * np.asarray(vs, dtype=np.float32)[:, None].astype(np.float64)
        if self.record is not None:
            self.record.setdefault("attn", []).append({"q": q, "k": k, "v": v, "kq": kq, "vq": vq})
        o = (i4t_attention(q, kq, vq) if mode == "i4t" else fp8_attention(q, kq, vq, qs, qs is not None))[1]
        o = o * sigmoid(gate)
        return o.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T, (k, v, kc, vc)

    def deltanet(self, xn, p):
        c, W = self.cfg, self.w
        T = xn.shape[0]
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        r = nv // nk
        qkvz = (xn @ W[p + "linear_attn.in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * r * dv)
        ba = (xn @ W[p + "linear_attn.in_proj_ba.weight"].T).reshape(T, nk, 2 * r)
        q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
        v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(T, nv, dv)
        z = qkvz[..., 2 * dk + r * dv:].reshape(T, nv, dv)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
        w = W[p + "linear_attn.conv1d.weight"][:, 0, :]  # [channels, K]
        padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], 0)
        conv = sum(padded[j:j + T] * w[:, j] for j in range(K))
        conv = silu(conv)
        kd = nk * dk
        q = conv[:, :kd].reshape(T, nk, dk)
        k = conv[:, kd:2 * kd].reshape(T, nk, dk)
        v = conv[:, 2 * kd:].reshape(T, nv, dv)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)
        beta = sigmoid(b)
        g = -np.exp(W[p + "linear_attn.A_log"]) * softplus(a + W[p + "linear_attn.dt_bias"])
        S = np.zeros((nv, dk, dv))
        o = np.zeros((T, nv, dv))
        for t in range(T):
            S = S * np.exp(g[t])[:, None, None]
            mem = np.einsum("hkv,hk->hv", S, k[t])
            S = S + k[t][:, :, None] * ((v[t] - mem) * beta[t][:, None])[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", S, q[t])
        o = rms_norm(o, W[p + "linear_attn.norm.weight"], c["rms_norm_eps"], False) * silu(z)
        return o.reshape(T, nv * dv) @ W[p + "linear_attn.out_proj.weight"].T

    def moe(self, hn, p):
        c, W = self.cfg, self.w
        E, k = c["num_experts"], c["num_experts_per_tok"]
        logits = hn @ W[p + "mlp.gate.weight"].T
        pr = np.exp(logits - logits.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        top = np.argsort(-pr, axis=-1, kind="stable")[:, :k]
        if self.record is not None:
            self.record.setdefault("experts", []).append(np.sort(top, axis=-1))
        tw = np.take_along_axis(pr, top, -1)
        if c["norm_topk_prob"]:
            tw = tw / tw.sum(-1, keepdims=True)
        out = np.zeros_like(hn)
        for e in range(E):
            rows, slot = np.nonzero(top == e)
            if len(rows) == 0:
                continue
            xe = hn[rows]
            q = f"{p}mlp.experts.{e}."
            y = (silu(xe @ W[q + "gate_proj.weight"].T) * (xe @ W[q + "up_proj.weight"].T)) @ W[q + "down_proj.weight"].T
            out[rows] += tw[rows, slot][:, None] * y
        if c.get("shared_expert_intermediate_size", 0) > 0:
            q = p + "mlp.shared_expert."
            y = (silu(hn @ W[q + "gate_proj.weight"].T) * (hn @ W[q + "up_proj.weight"].T)) @ W[q + "down_proj.weight"].T
            out += sigmoid(hn @ W[p + "mlp.shared_expert_gate.weight"].T) * y
        return out
