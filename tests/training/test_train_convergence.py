"""A tiny model learns real text: on tiny-shakespeare (BPE-512) 120 steps of 512 tokens
(61K tokens, ~10 s on one core) bring the validation loss well below two baselines:

- ln(vocab) = 6.24 nats, a uniform guess (where training starts);
- the unigram cross-entropy of the validation split under add-one-smoothed train-split token
  frequencies (~5.16 nats): the best any model can do without looking at context.

Threshold: val_loss < unigram - 0.3 nats. Measured: ~4.5 after 100 steps (0.65 below the
unigram baseline), so the margin is comfortable yet a model that ignored context (a broken
attention mask, positions or targets shifted wrongly, a learning rate of zero) cannot pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from taperlm.cli import main as cli_main
from taperlm.config import apply_overrides, run_config_from_dict, to_dict
from taperlm.config.presets import get_preset
from taperlm.training.loop import train


@pytest.fixture(scope="module")
def shakespeare(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("shk") / "data"
    src = shared_data / "corpora" / "tinyshakespeare" / "input.txt"
    assert (
        cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(out)])
        == 0
    )
    return out


def unigram_cross_entropy(data_dir) -> float:
    from taperlm.data.loader import open_split

    meta, train_tokens = open_split(data_dir, "train")
    _, val_tokens = open_split(data_dir, "val")
    counts = np.bincount(np.asarray(train_tokens), minlength=meta["vocab_size"]) + 1.0
    p = counts / counts.sum()
    return float(-np.log(p[np.asarray(val_tokens)]).mean())


def test_tiny_model_beats_unigram_baseline(shakespeare, tmp_path):
    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(
        data,
        [
            "model.n_layers=2",
            "model.d_model=64",
            "model.n_heads=4",
            "model.mlp_width=176",
            "model.vocab_size=512",
            "model.context_length=64",
            "model.taper=cosine:1.5:0.5",
            "train.seq_len=64",
            "train.micro_batch_size=8",
            "train.batch_tokens=512",
            "train.tokens=61440",
            "train.warmup_tokens=5120",
            "train.lr=0.01",
            "train.eval_every=0",
            "train.eval_tokens=4096",
            "train.checkpoint_every=0",
            "train.log_every=20",
        ],
    )
    cfg = run_config_from_dict(data).resolve()
    cfg.data.dir = str(shakespeare)
    unigram = unigram_cross_entropy(shakespeare)
    assert 4.5 < unigram < math.log(512)
    res = train(cfg, tmp_path / "run", progress=False)
    assert res.val_loss is not None
    assert res.val_loss < unigram - 0.3, (res.val_loss, unigram)
    assert (tmp_path / "run" / "loss.png").is_file()
