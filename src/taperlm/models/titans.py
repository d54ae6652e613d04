"""Titans blocks (Behrouz et al. 2025): neural long-term memory combined with attention.

Every block is `h = x + mixer(norm(x)); out = h + SwiGLU_l(norm(h))` with the tapered SwiGLU width
of layer l. Mixers (u = norm(x)); choices are recorded in docs/architectures.md:

- MAG (memory as gate): a = SWA(u) (sliding window, persistent-token prefix), m = LMM(u);
  out = RMSNorm_a(a) * sigmoid(RMSNorm_m(m)).
- MAL (memory as layer): m = LMM(u); out = m + SWA(RMSNorm(u + m)).
- MAC (memory as context), per segment s of `segment_len` tokens, sequential over segments:
  h_s = LMM-output(M_{s-1}(q(u_s))) (one retrieved memory token per input token, read with the
  memory at the end of segment s-1); y_s = Attn over [persistent | h_s | u_s] with a
  segment-causal mask (query i sees every persistent token, h_j and u_j for j <= i of its own
  segment); the memory then reads/writes y_s chunk-wise and out_s = RMSNorm(y_s) *
  sigmoid(RMSNorm(LMM-output(read))).

Persistent memory: N_p learned tokens in model space prefixed to the attention input; their keys
and values come from the attention's own K/V projection. RoPE positions are local to the
attention block (SWA: query block of `window` tokens plus the previous block; MAC: the segment),
with persistent tokens at positions 0..N_p-1, so every query sees them at a bounded distance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from taperlm.models.layers import Block, RMSNorm, Rotary, SwiGLU
from taperlm.models.memory import MemoryState, MemoryStream, NeuralMemory
from taperlm.spec.model_fields import ModelFields


def window_mask(window: int, n_persistent: int, first: bool, device=None) -> torch.Tensor:
    """Boolean mask [W, N_p + 2W] of one query block of W = window tokens over keys
    [persistent | previous block | current block]: query i sees all persistent keys, previous-block
    key j iff j > i (distance < window) and current-block key j iff j <= i."""
    i = torch.arange(window, device=device).view(-1, 1)
    j = torch.arange(window, device=device).view(1, -1)
    prev = (j > i) & (not first)
    cur = j <= i
    pers = torch.ones(window, n_persistent, dtype=torch.bool, device=device)
    return torch.cat((pers, prev, cur), 1)


def segment_mask(seg: int, n_persistent: int, device=None) -> torch.Tensor:
    """Boolean mask [S, N_p + 2S] of one MAC segment over keys [persistent | memory tokens h |
    segment tokens]: query i sees every persistent token and h_j, x_j for j <= i."""
    causal = torch.ones(seg, seg, dtype=torch.bool, device=device).tril()
    pers = torch.ones(seg, n_persistent, dtype=torch.bool, device=device)
    return torch.cat((pers, causal, causal), 1)


def _rot(rotary: Rotary | None, x: torch.Tensor, start: int) -> torch.Tensor:
    return x if rotary is None else rotary(x, start)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kp: torch.Tensor,
    vp: torch.Tensor,
    window: int,
    rotary: Rotary | None,
) -> torch.Tensor:
    """Causal sliding-window attention with a persistent prefix, computed blockwise.

    q: [B, H, T, hd]; k, v: [B, Hkv, T, hd] (not rotated); kp, vp: [Hkv, N_p, hd] (persistent keys
    already rotated at positions 0..N_p-1). Query blocks of `window` tokens attend to the previous
    block and their own, RoPE positions N_p + j (previous) and N_p + W + j (current) — relative
    distances between tokens are exact. Returns [B, H, T, hd].
    """
    B, H, T, hd = q.shape
    Hkv = k.shape[1]
    W = window
    nb = -(-T // W)
    pad = nb * W - T
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    Np = kp.shape[1]
    qb = _rot(rotary, q.view(B, H, nb, W, hd), Np + W)
    kb = k.view(B, Hkv, nb, W, hd)
    vb = v.view(B, Hkv, nb, W, hd)
    k_cur = _rot(rotary, kb, Np + W)
    pers_k = kp.view(1, Hkv, 1, Np, hd).expand(B, Hkv, nb, Np, hd).to(q.dtype)
    pers_v = vp.view(1, Hkv, 1, Np, hd).expand(B, Hkv, nb, Np, hd).to(q.dtype)
    if nb > 1:
        k_prev = F.pad(_rot(rotary, kb, Np)[:, :, :-1], (0, 0, 0, 0, 1, 0))
        v_prev = F.pad(vb[:, :, :-1], (0, 0, 0, 0, 1, 0))
        keys = torch.cat((pers_k, k_prev, k_cur), 3)
        vals = torch.cat((pers_v, v_prev, vb), 3)
        mask = torch.stack([window_mask(W, Np, b == 0, q.device) for b in range(nb)])
    else:
        keys = torch.cat((pers_k, k_cur), 3)
        vals = torch.cat((pers_v, vb), 3)
        full = window_mask(W, Np, True, q.device)
        mask = torch.cat((full[:, :Np], full[:, Np + W :]), 1).unsqueeze(0)
    K = keys.shape[3]
    fold = lambda x, h: x.transpose(1, 2).reshape(B * nb, h, -1, hd)  # noqa: E731
    mask = mask.unsqueeze(0).expand(B, nb, W, K).reshape(B * nb, 1, W, K)
    y = F.scaled_dot_product_attention(
        fold(qb, H), fold(keys, Hkv), fold(vals, Hkv), attn_mask=mask, enable_gqa=Hkv != H
    )
    y = y.view(B, nb, H, W, hd).transpose(1, 2).reshape(B, H, nb * W, hd)
    return y[:, :, :T]


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kh: torch.Tensor,
    vh: torch.Tensor,
    kp: torch.Tensor,
    vp: torch.Tensor,
    seg: int,
) -> torch.Tensor:
    """MAC attention of whole segments (inputs already rotated). q: [B, H, T, hd]; k, v (segment
    tokens) and kh, vh (memory tokens): [B, Hkv, T, hd]; kp, vp: [Hkv, N_p, hd]; T % seg == 0 or
    T < seg. Every segment attends to [persistent | its memory tokens | its tokens] under
    `segment_mask`. Returns [B, H, T, hd]."""
    B, H, T, hd = q.shape
    Hkv = k.shape[1]
    S = min(seg, T)
    n = T // S
    Np = kp.shape[1]
    split = lambda x, h: x.view(B, h, n, S, hd).transpose(1, 2).reshape(B * n, h, S, hd)  # noqa: E731
    pk = kp.unsqueeze(0).expand(B * n, Hkv, Np, hd).to(q.dtype)
    pv = vp.unsqueeze(0).expand(B * n, Hkv, Np, hd).to(q.dtype)
    keys = torch.cat((pk, split(kh, Hkv), split(k, Hkv)), 2)
    vals = torch.cat((pv, split(vh, Hkv), split(v, Hkv)), 2)
    mask = segment_mask(S, Np, q.device)
    y = F.scaled_dot_product_attention(split(q, H), keys, vals, attn_mask=mask, enable_gqa=Hkv != H)
    return y.view(B, n, H, S, hd).transpose(1, 2).reshape(B, H, T, hd)


class WindowCache:
    """Decoding cache of sliding-window attention: the unrotated keys and values of the tokens
    from `start` (the first token of the block before the newest token's block: all a later
    query can see) to the last one, and the position of the next token."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.start = 0
        self.pos = 0

    def select(self, index: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)  # type: ignore[union-attr]


class SegmentCache:
    """Decoding cache of MAC attention within the current segment: keys (rotated at their
    segment-local positions) and values of its memory tokens (kh, vh) and tokens (k, v)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.kh: torch.Tensor | None = None
        self.vh: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, *kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        names = ("k", "v", "kh", "vh")
        for name, x in zip(names, kv):
            old = getattr(self, name)
            setattr(self, name, x if old is None else torch.cat((old, x), 2))
        return tuple(getattr(self, name) for name in names)

    def select(self, index: torch.Tensor) -> None:
        for name in ("k", "v", "kh", "vh"):
            x = getattr(self, name)
            if x is not None:
                setattr(self, name, x.index_select(0, index))


class TitansCache:
    """Incremental-decoding state of one Titans layer: the position of the next token, the
    attention cache (WindowCache for MAG/MAL, SegmentCache for MAC), the memory stream; MAC
    also keeps the conv tail of its memory-token queries and the memory state at the start of
    the current segment (which its memory tokens read)."""

    def __init__(self, attn: WindowCache | SegmentCache, heads: int) -> None:
        self.pos = 0
        self.attn = attn
        self.memory = MemoryStream()
        self.heads = heads
        self.query_tail: torch.Tensor | None = None
        self.segment_state: MemoryState | None = None

    def get_seq_length(self) -> int:
        return self.pos

    def select(self, index: torch.Tensor) -> None:
        """Keep/reorder the batch rows `index` (beam search, batch selection)."""
        self.attn.select(index)
        self.memory.select(index, self.heads)
        if self.query_tail is not None:
            self.query_tail = self.query_tail.index_select(0, index)
        if self.segment_state is not None:
            self.segment_state = self.segment_state.select(index, self.heads)


class TitansAttention(nn.Module):
    """Softmax attention with RoPE and N_p persistent tokens (model-space, projected by W_kv);
    layer l's own query/KV heads (`cfg.attention_heads`) at the model's head dim."""

    def __init__(self, cfg: ModelFields, layer: int, rotary: Rotary) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.H, self.Hkv = cfg.attention_heads(layer)
        self.hd = hd
        self.w_q = nn.Linear(d, self.H * hd, bias=False)
        self.w_kv = nn.Linear(d, 2 * self.Hkv * hd, bias=False)
        self.out = nn.Linear(self.H * hd, d, bias=False)
        self.out.residual_out = True  # type: ignore[attr-defined]
        self.persistent = nn.Parameter(torch.randn(cfg.titans.persistent_tokens, d))
        self.rotary = rotary

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads, self.hd).transpose(1, 2)

    def kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.w_kv(x).chunk(2, dim=-1)
        return self._split(k, self.Hkv), self._split(v, self.Hkv)

    def persistent_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Persistent keys (rotated at positions 0..N_p-1) and values: [Hkv, N_p, hd]."""
        k, v = self.kv(self.persistent.unsqueeze(0).to(dtype))
        return self.rotary(k, 0)[0], v[0]

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        B, H, T, hd = y.shape
        return self.out(y.transpose(1, 2).reshape(B, T, H * hd))

    def sliding(self, u: torch.Tensor, window: int) -> torch.Tensor:
        q = self._split(self.w_q(u), self.H)
        k, v = self.kv(u)
        kp, vp = self.persistent_kv(q.dtype)
        return self.merge(sliding_window_attention(q, k, v, kp, vp, window, self.rotary))

    def with_memory_tokens(self, u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One MAC segment: queries from u attend to [persistent | h | u] (segment-local RoPE:
        persistent at 0..N_p-1, h_j and u_j both at N_p + j)."""
        q = self._split(self.w_q(u), self.H)
        k, v = self.kv(u)
        kh, vh = self.kv(h)
        kp, vp = self.persistent_kv(q.dtype)
        Np = kp.shape[1]
        q, k, kh = (self.rotary(x, Np) for x in (q, k, kh))
        return self.merge(segment_attention(q, k, v, kh, vh, kp, vp, u.shape[1]))

    # -- incremental decoding ----------------------------------------------------------------
    def sliding_cached(self, u: torch.Tensor, window: int, cache: WindowCache) -> torch.Tensor:
        """`sliding` for tokens that continue the cached sequence (the same keys, positions and
        RoPE angles as the full-sequence computation)."""
        B, Tn, _ = u.shape
        q = self._split(self.w_q(u), self.H)
        k, v = self.kv(u)
        kp, vp = self.persistent_kv(q.dtype)
        t0, W, Np = cache.pos, window, kp.shape[1]
        K = k if cache.k is None else torch.cat((cache.k, k), 2)
        V = v if cache.v is None else torch.cat((cache.v, v), 2)
        if Tn == 1:  # one query at block position i: previous block j > i, current block j <= i
            i, cur = t0 % W, t0 - t0 % W - cache.start
            keys = [kp.unsqueeze(0).expand(B, -1, -1, -1).to(q.dtype)]
            vals = [vp.unsqueeze(0).expand(B, -1, -1, -1).to(q.dtype)]
            if t0 >= W and i < W - 1:
                keys.append(self.rotary(K[:, :, cur - W + i + 1 : cur], Np + i + 1))
                vals.append(V[:, :, cur - W + i + 1 : cur])
            keys.append(self.rotary(K[:, :, cur:], Np + W))
            vals.append(V[:, :, cur:])
            y = F.scaled_dot_product_attention(
                self.rotary(q, Np + W + i),
                torch.cat(keys, 2),
                torch.cat(vals, 2),
                enable_gqa=self.Hkv != self.H,
            )
        else:  # blockwise from `start` (a block boundary); cached tokens' queries are dropped
            n_old = t0 - cache.start
            q_all = torch.cat((q.new_zeros(B, self.H, n_old, self.hd), q), 2) if n_old else q
            y = sliding_window_attention(q_all, K, V, kp, vp, W, self.rotary)[:, :, n_old:]
        cache.pos = t0 + Tn
        keep = max(0, (cache.pos // W - 1) * W)
        cache.k, cache.v = K[:, :, keep - cache.start :], V[:, :, keep - cache.start :]
        cache.start = keep
        return self.merge(y)

    def with_memory_tokens_cached(
        self, u: torch.Tensor, h: torch.Tensor, cache: SegmentCache
    ) -> torch.Tensor:
        """`with_memory_tokens` for tokens (and their memory tokens) that continue the current
        segment of the cache."""
        Tn = u.shape[1]
        q = self._split(self.w_q(u), self.H)
        k, v = self.kv(u)
        kh, vh = self.kv(h)
        kp, vp = self.persistent_kv(q.dtype)
        Np, i0 = kp.shape[1], cache.length
        q, k, kh = (self.rotary(x, Np + i0) for x in (q, k, kh))
        k, v, kh, vh = cache.append(k, v, kh, vh)
        B, n = q.shape[0], i0 + Tn
        keys = torch.cat((kp.unsqueeze(0).expand(B, -1, -1, -1).to(q.dtype), kh, k), 2)
        vals = torch.cat((vp.unsqueeze(0).expand(B, -1, -1, -1).to(q.dtype), vh, v), 2)
        mask = None
        if Tn > 1:  # query i0 + i sees the persistent tokens and h_j, u_j for j <= i0 + i
            causal = torch.ones(Tn, n, dtype=torch.bool, device=q.device).tril(i0)
            pers = torch.ones(Tn, Np, dtype=torch.bool, device=q.device)
            mask = torch.cat((pers, causal, causal), 1)
        y = F.scaled_dot_product_attention(
            q, keys, vals, attn_mask=mask, enable_gqa=self.Hkv != self.H
        )
        return self.merge(y)


def _memory(cfg: ModelFields, layer: int) -> NeuralMemory:
    t = cfg.titans
    assert t.memory_widths is not None
    return NeuralMemory(
        cfg.d_model,
        t.memory_heads,
        t.memory_head_dim,
        t.memory_widths[layer],
        t.memory_depth,
        t.chunk_size,
        t.conv_kernel,
        t.max_inner_lr,
        cfg.norm_eps,
        t.max_inner_grad_norm or None,
    )


class _GatedByMemory(nn.Module):
    """Attention and memory combined as RMSNorm(attention) * sigmoid(RMSNorm(memory)) (MAG, MAC)."""

    def __init__(self, cfg: ModelFields, layer: int, rotary: Rotary) -> None:
        super().__init__()
        self.attn = TitansAttention(cfg, layer, rotary)
        self.memory = _memory(cfg, layer)
        self.norm_attn = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.norm_mem = RMSNorm(cfg.d_model, cfg.norm_eps)

    def combine(self, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return self.norm_attn(a) * torch.sigmoid(self.norm_mem(m))


class MAGMixer(_GatedByMemory):
    """Memory as gate: RMSNorm(SWA(u)) * sigmoid(RMSNorm(LMM(u)))."""

    def __init__(self, cfg: ModelFields, layer: int, rotary: Rotary) -> None:
        super().__init__(cfg, layer, rotary)
        self.window = cfg.titans.window

    def new_cache(self) -> TitansCache:
        return TitansCache(WindowCache(), self.memory.heads)

    def forward(self, u: torch.Tensor, cache: TitansCache | None = None) -> torch.Tensor:
        if cache is None:
            return self.combine(self.attn.sliding(u, self.window), self.memory(u))
        a = self.attn.sliding_cached(u, self.window, cache.attn)  # type: ignore[arg-type]
        m = self.memory(u, cache.memory)
        cache.pos += u.shape[1]
        return self.combine(a, m)


class MALMixer(nn.Module):
    """Memory as layer: m = LMM(u); m + SWA(RMSNorm(u + m))."""

    def __init__(self, cfg: ModelFields, layer: int, rotary: Rotary) -> None:
        super().__init__()
        self.window = cfg.titans.window
        self.memory = _memory(cfg, layer)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = TitansAttention(cfg, layer, rotary)

    def new_cache(self) -> TitansCache:
        return TitansCache(WindowCache(), self.memory.heads)

    def forward(self, u: torch.Tensor, cache: TitansCache | None = None) -> torch.Tensor:
        if cache is None:
            m = self.memory(u)
            return m + self.attn.sliding(self.norm(u + m), self.window)
        m = self.memory(u, cache.memory)
        cache.pos += u.shape[1]
        return m + self.attn.sliding_cached(self.norm(u + m), self.window, cache.attn)  # type: ignore[arg-type]


class MACMixer(_GatedByMemory):
    """Memory as context, sequential over segments (see the module docstring)."""

    def __init__(self, cfg: ModelFields, layer: int, rotary: Rotary) -> None:
        super().__init__(cfg, layer, rotary)
        self.segment = cfg.titans.segment_len

    def new_cache(self) -> TitansCache:
        return TitansCache(SegmentCache(), self.memory.heads)

    def _attend(
        self,
        u_s: torch.Tensor,
        q_s: torch.Tensor,
        og_s: torch.Tensor,
        state: MemoryState,
        cache: SegmentCache | None,
    ) -> torch.Tensor:
        """(A piece of) one segment's attention y = Attn([persistent | h | u]), with memory
        tokens h read from `state` (the memory at the segment start)."""
        with torch.autocast(device_type=u_s.device.type, enabled=False):
            h_raw = self.memory.read(state, q_s)
        h = self.memory.output(h_raw, og_s)
        if cache is None:
            return self.attn.with_memory_tokens(u_s, h)
        return self.attn.with_memory_tokens_cached(u_s, h, cache)

    def forward(self, u: torch.Tensor, cache: TitansCache | None = None) -> torch.Tensor:
        if cache is not None:
            return self._forward_cached(u, cache)
        B, T, _ = u.shape
        mem = self.memory
        q_u, og_u, _ = mem.project_queries(u)  # memory queries of the segment inputs
        state = mem.initial_state(B)
        tail = None  # conv context of the y stream across segments
        outs = []
        for s in range(0, T, self.segment):
            e = min(s + self.segment, T)
            y = self._attend(u[:, s:e], q_u[:, s:e], og_u[:, s:e], state, None)
            q_y, k_y, v_y, g_y, og_y, tail = mem.project(y, tail)
            with torch.autocast(device_type=u.device.type, enabled=False):
                r, state = mem.write_read(state, q_y, k_y, v_y, g_y)
            outs.append(self.combine(y, mem.output(r, og_y)))
        return torch.cat(outs, 1)

    def _forward_cached(self, u: torch.Tensor, cache: TitansCache) -> torch.Tensor:
        """Tokens that continue the cached sequence, piece by piece within segments."""
        mem, stream = self.memory, cache.memory
        q_u, og_u, cache.query_tail = mem.project_queries(u, cache.query_tail)
        outs, s, Tn = [], 0, u.shape[1]
        while s < Tn:
            local = cache.pos % self.segment
            if local == 0:  # a new segment: its memory tokens read the state at its start
                if stream.state is None:
                    stream.state = mem.initial_state(u.shape[0])
                cache.segment_state, cache.attn = stream.state, SegmentCache()
            e = min(Tn, s + self.segment - local)
            assert cache.segment_state is not None and isinstance(cache.attn, SegmentCache)
            y = self._attend(u[:, s:e], q_u[:, s:e], og_u[:, s:e], cache.segment_state, cache.attn)
            q_y, k_y, v_y, g_y, og_y, stream.tail = mem.project(y, stream.tail)
            with torch.autocast(device_type=u.device.type, enabled=False):
                r = mem.continue_stream(stream, q_y, k_y, v_y, g_y)
            outs.append(self.combine(y, mem.output(r, og_y)))
            cache.pos += e - s
            s = e
        return torch.cat(outs, 1)


MIXERS = {"mac": MACMixer, "mag": MAGMixer, "mal": MALMixer}


def titans_block(cfg: ModelFields, layer: int, rotary: Rotary) -> Block:
    assert cfg.mlp_widths is not None
    mixer = MIXERS[cfg.titans.variant](cfg, layer, rotary)
    return Block(mixer, SwiGLU(cfg.d_model, cfg.mlp_widths[layer]), cfg.d_model, cfg.norm_eps)
