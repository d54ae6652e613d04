"""`taperlm import HF_FOLDER --out RUN`: randomly initialised LlamaForCausalLM, Qwen2ForCausalLM
and MistralForCausalLM saved by transformers (safetensors) become runs whose logits equal
transformers' (tied and untied heads, grouped-query and multi-head attention, one file or
shards); everything the import cannot carry is refused by name with nothing written; the run
is accepted by generate, export, eval, novelty and train (which continues it, reproducibly)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch

import fault_harness as H

transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()  # stderr holds only the command's own lines

from taperlm.checkpoint import store  # noqa: E402
from taperlm.checkpoint.loading import load_any, load_run_model  # noqa: E402
from taperlm.cli import main  # noqa: E402

VOCAB = 320  # the harness tokenizer's 300 ids, padded as real checkpoints often are
ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}
# Logits reach ~8 with this init; transformers' eager attention and our SDPA differ by float
# rounding only (measured 2.4e-6 to 3.5e-6).
ATOL = 1e-4


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("import-data"))


def make_hf(folder: Path, data: Path | None, arch: str = "llama", tied: bool = False,
            kv: int = 2, seed: int = 0, **save) -> Path:  # fmt: skip
    """A randomly initialised checkpoint folder of `arch` saved by transformers (with the data
    dir's tokenizer). Non-default eps and theta, and a width that is no multiple of 16, so each
    mapping matters; a large init, so attention (and RoPE) shape the logits."""
    config_cls, model_cls = ARCHS[arch]
    cfg = config_cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv,
        max_position_embeddings=64,
        rms_norm_eps=0.05,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=tied,
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a swapped norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, **save)
    if data is not None:
        shutil.copy(data / "tokenizer" / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder


def hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    arch = json.loads((folder / "config.json").read_text())["model_type"]
    model = ARCHS[arch][1].from_pretrained(folder).eval()
    with torch.no_grad():
        return model(ids).logits


def our_logits(run: Path, ids: torch.Tensor) -> torch.Tensor:
    model, _ = load_run_model(run)
    with torch.no_grad():
        return model(ids).logits


def import_(folder: Path, out: Path, *extra: str) -> int:
    return main(["import", str(folder), "--out", str(out), *extra])


def _ids(n: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# logits equal


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize(("tied", "kv"), [(False, 2), (True, 4)])
def test_imported_logits_equal_transformers(tmp_path, data, arch, tied, kv):
    folder = make_hf(tmp_path / "hf", data, arch, tied=tied, kv=kv)
    assert import_(folder, tmp_path / "run") == 0
    ids = _ids()
    theirs = hf_logits(folder, ids)
    assert theirs.abs().max() > 1.0  # a large enough signal for the tolerance to mean something
    torch.testing.assert_close(our_logits(tmp_path / "run", ids), theirs, atol=ATOL, rtol=0)
    m, _ = load_run_model(tmp_path / "run")
    cfg = m.config
    assert (cfg.mlp_widths, cfg.kv_heads, cfg.tie_embeddings) == ([40] * 3, kv, tied)
    assert (cfg.norm_eps, cfg.rope_theta, cfg.vocab_size) == (0.05, 500.0, VOCAB)


def test_the_comparison_sees_a_wrong_mapping(tmp_path, data, monkeypatch):
    """The check above fails when a mapping is wrong: here q and k swapped in the fused matrix
    (same shapes under multi-head attention), and the RMSNorm eps left at our default."""
    import taperlm.hf.llama as L

    folder = make_hf(tmp_path / "hf", data, "llama", kv=4)
    ids = _ids()
    theirs = hf_logits(folder, ids)
    real = L.to_taperlm

    def swapped(hf, cfg):
        out = real(hf, cfg)
        for i in range(cfg.n_layers):
            q, k, v = out[f"blocks.{i}.mixer.qkv.weight"].chunk(3)
            out[f"blocks.{i}.mixer.qkv.weight"] = torch.cat([k, q, v])
        return out

    monkeypatch.setattr(L, "to_taperlm", swapped)
    assert import_(folder, tmp_path / "a") == 0
    assert (our_logits(tmp_path / "a", ids) - theirs).abs().max() > 1e-2
    monkeypatch.setattr(L, "to_taperlm", real)
    real_config = L.model_config

    def default_eps(folder, data=None):
        cfg = real_config(folder, data)
        cfg.norm_eps = 1e-6
        return cfg

    monkeypatch.setattr(L, "model_config", default_eps)
    assert import_(folder, tmp_path / "b") == 0
    assert (our_logits(tmp_path / "b", ids) - theirs).abs().max() > 1e-3


def test_sharded_bf16_checkpoint(tmp_path, data):
    """Shards named by model.safetensors.index.json, bf16 weights: read exactly (bf16 -> fp32 is
    exact), so the logits equal transformers' fp32 computation of the same bf16 values."""
    folder = make_hf(tmp_path / "hf", data, "mistral", max_shard_size="20KB")
    model = transformers.MistralForCausalLM.from_pretrained(folder).to(torch.bfloat16)
    shutil.rmtree(folder)
    model.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    assert import_(folder, tmp_path / "run") == 0
    ids = _ids()
    # transformers' own fp32 computation of the bf16 values (loaded fresh: a model cast to bf16
    # and back keeps its RoPE frequencies rounded to bf16)
    ref = transformers.MistralForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert ref.model.embed_tokens.weight.dtype == torch.float32
    with torch.no_grad():
        theirs = ref(ids).logits
    torch.testing.assert_close(our_logits(tmp_path / "run", ids), theirs, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# refusals, by name, nothing written


def _edit(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))


CONFIG_REFUSALS = {
    "rope_parameters": (
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0}},
        "rope_type 'yarn'",
    ),
    "old_rope_scaling": ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    "partial_rotary": (
        {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            }
        },
        "partial_rotary_factor",
    ),
    # attention_bias: true declares biases the weights lack
    "attention_bias": ({"attention_bias": True}, "'model.layers.0.self_attn.o_proj.bias'"),
    "mlp_bias": ({"mlp_bias": True}, "mlp_bias: true"),
    "sliding_window": ({"sliding_window": 16}, "sliding window of 16 tokens"),
    "layer_types": ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    "activation": ({"hidden_act": "gelu"}, "activation is 'gelu'"),
    "head_dim": ({"head_dim": 16}, "do not have the shapes its config.json gives"),
    "auto_map": ({"auto_map": {"AutoModelForCausalLM": "x.Y"}}, "auto_map"),
    "quantized": ({"quantization_config": {"bits": 4}}, "quantization_config"),
    "unknown_key": ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    "architecture": ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
    "model_type": ({"model_type": "qwen2"}, "model_type 'qwen2'"),  # llama weights, qwen2 name
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_config_refusals_by_name(tmp_path, data, capsys, case):
    folder = make_hf(tmp_path / "hf", data, "mistral" if case == "sliding_window" else "llama")
    changes, needle = CONFIG_REFUSALS[case]
    _edit(folder, **changes)
    out = tmp_path / "run"
    assert import_(folder, out) == 2
    err = capsys.readouterr().err
    assert err.startswith("taperlm import: error: "), err
    assert needle in err, err
    assert "Traceback" not in err
    assert not out.exists()


def test_qwen2_sliding_window_and_biases(tmp_path, data, capsys):
    """Qwen2: a used sliding window shorter than the context is refused; non-zero q/k/v biases
    import exactly (model.attention_bias, tests/export/test_import_architectures.py)."""
    folder = make_hf(tmp_path / "hf", data, "qwen2")
    _edit(folder, use_sliding_window=True, sliding_window=16)
    assert import_(folder, tmp_path / "a") == 2
    assert "sliding window of 16" in capsys.readouterr().err
    _edit(folder, use_sliding_window=False)
    assert import_(folder, tmp_path / "b") == 0  # an unused window changes nothing
    model = transformers.Qwen2ForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.bias.fill_(0.1)
    model.save_pretrained(folder)
    assert import_(folder, tmp_path / "c") == 0
    ids = _ids()
    torch.testing.assert_close(our_logits(tmp_path / "c", ids), hf_logits(folder, ids),
                               atol=ATOL, rtol=0)  # fmt: skip
    assert load_run_model(tmp_path / "c")[0].config.attention_bias == "qkv"


def test_weight_refusals(tmp_path, data, capsys):
    """Pickle weights are never opened; a crafted safetensors header, a quantized dtype, a shard
    outside the folder, a missing tensor and a duplicate config key are refused by name."""
    folder = make_hf(tmp_path / "hf", data)
    weights = folder / "model.safetensors"
    good = weights.read_bytes()

    def refused(needle: str) -> None:
        assert import_(folder, tmp_path / "run") == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
        assert not (tmp_path / "run").exists()

    weights.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not opened")
    refused("pickle files (pytorch_model.bin)")
    (folder / "pytorch_model.bin").unlink()
    weights.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    refused("its header claims 1099511627776 bytes")
    header = json.dumps({"x": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    weights.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    refused("dtype 'I8'")
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}}).encode()
    weights.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    refused("outside the file's 16 data bytes")
    weights.unlink()
    (tmp_path / "outside.safetensors").write_bytes(good)
    index = {"weight_map": {"model.norm.weight": "../outside.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    refused("names the shard '../outside.safetensors', which is not a file name in that folder")
    index = {"weight_map": {"model.norm.weight": "/etc/passwd"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    refused("names the shard '/etc/passwd'")
    (folder / "model.safetensors.index.json").unlink()
    weights.write_bytes(good)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder)
    state = {k: v for k, v in hf.state_dict().items() if "layers.2.mlp.up_proj" not in k}
    from safetensors.torch import save_file

    save_file(state, str(weights))
    refused("missing ['model.layers.2.mlp.up_proj.weight']")
    weights.write_bytes(good)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace("{", '{"vocab_size": 7, ', 1))
    refused("'vocab_size' is given twice")


def test_a_hub_cache_snapshot_imports(tmp_path, data):
    """A Hugging Face Hub cache snapshot: every file a link into ../../blobs (sharded here), as
    `from_pretrained` leaves a download; links among the folder's own files are followed."""
    made = make_hf(tmp_path / "made", data, "llama", max_shard_size="20KB")
    blobs = tmp_path / "models--x--y" / "blobs"
    snap = tmp_path / "models--x--y" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(made.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        (snap / f.name).symlink_to(Path("../../blobs") / f"blob{i}")
    assert import_(snap, tmp_path / "run") == 0
    ids = _ids()
    torch.testing.assert_close(
        our_logits(tmp_path / "run", ids), hf_logits(made, ids), atol=ATOL, rtol=0
    )


def test_fifo_config_is_refused_without_blocking(tmp_path, data, capsys):
    folder = make_hf(tmp_path / "hf", data)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    assert import_(folder, tmp_path / "run") == 2
    assert "a FIFO (named pipe), not a regular file" in capsys.readouterr().err


def test_the_start_checkpoint_resumes_as_a_fresh_adamw(tmp_path, data):
    """What `train` restores from the imported step-0 checkpoint is the state a fresh AdamW
    takes its first step from (step 0, zero moments), so the first update is a first update;
    and the weights are the checkpoint's."""
    from taperlm.training.checkpointer import restore_training
    from taperlm.training.optim import build_optimizer

    folder = make_hf(tmp_path / "hf", data, tied=True)
    assert import_(folder, tmp_path / "run") == 0
    model, run = load_run_model(tmp_path / "run")
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    optimizer = build_optimizer(model, run.train, torch.device("cpu"))
    path = store.list_checkpoints(tmp_path / "run")[0][1]
    state = restore_training(path, model, optimizer, [])
    assert state["step"] == 0 and state["loader"][0]["sample"] == 0
    assert all(torch.equal(trained[k], v) for k, v in model.state_dict().items())
    steps = [float(s["step"]) for s in optimizer.state.values()]
    assert steps and set(steps) == {0.0}
    assert all(
        not s["exp_avg"].any() and not s["exp_avg_sq"].any() for s in optimizer.state.values()
    )


def test_import_leaves_the_callers_generators_alone(tmp_path, data):
    from taperlm.interop.importing import import_checkpoint

    folder = make_hf(tmp_path / "hf", data)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    import_checkpoint(folder, tmp_path / "run")
    assert torch.equal(torch.rand(3), expected)


def test_a_failed_import_leaves_nothing(tmp_path, data, monkeypatch, capsys):
    """A write that fails after the checkpoint (here the tokenizer's, as on a full disk) removes
    what the import wrote, and the folder it created."""
    from taperlm.data.tokenizer import Tokenizer

    folder = make_hf(tmp_path / "hf", data)

    def full(self, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Tokenizer, "save", full)
    with pytest.raises(OSError):
        import_(folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError):
        import_(folder, tmp_path / "empty")
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


def test_an_existing_run_is_never_overwritten(tmp_path, data, capsys):
    folder = make_hf(tmp_path / "hf", data)
    assert import_(folder, tmp_path / "run") == 0
    before = (tmp_path / "run" / "config.yaml").read_text()
    _edit(folder, rms_norm_eps=0.2)
    assert import_(folder, tmp_path / "run") == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert (tmp_path / "run" / "config.yaml").read_text() == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert import_(folder, tmp_path / "mine") == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_model_settings_cannot_be_overridden(tmp_path, data, capsys):
    folder = make_hf(tmp_path / "hf", data)
    assert import_(folder, tmp_path / "run", "--set", "model.n_layers=2") == 2
    assert "the model of an imported run is the checkpoint's" in capsys.readouterr().err
    assert import_(folder, tmp_path / "run", "--set", "d_model=64") == 2
    assert "--set changed the model" in capsys.readouterr().err


def test_taperlm_set_applies_after_set_and_may_not_change_the_model(
    tmp_path, data, capsys, monkeypatch
):
    """import honours $TAPERLM_SET like every command that builds a run config: after --set (it
    wins), and, like --set, never on the checkpoint's model (refused naming TAPERLM_SET)."""
    from taperlm.config import load_run_config

    folder = make_hf(tmp_path / "hf", data)
    monkeypatch.setenv("TAPERLM_SET", "train.lr=3e-4 train.tokens=65536")
    args = ("--set", "train.lr=1e-4", "--set", "train.warmup_tokens=1024")
    assert import_(folder, tmp_path / "run", *args) == 0
    train = load_run_config(tmp_path / "run" / "config.yaml").train
    assert (train.lr, train.tokens, train.warmup_tokens) == (3e-4, 65536, 1024)
    for setting, named in (("model.n_layers=2", "model.n_layers=2"), ("d_model=64", "d_model")):
        monkeypatch.setenv("TAPERLM_SET", setting)
        assert import_(folder, tmp_path / f"run-{named}") == 2
        err = capsys.readouterr().err
        assert "TAPERLM_SET" in err and named in err and "checkpoint's" in err, err


# ----------------------------------------------------------------------------------------------
# the run is a normal run


def test_the_run_works_with_every_command(tmp_path, data, capsys):
    """generate, export (its logits equal transformers'), train (continues from the imported
    weights; twice from copies gives identical weights), eval and novelty on the result."""
    folder = make_hf(tmp_path / "hf", data, "llama", tied=True)
    run = tmp_path / "run"
    sets = [s for s in H.TINY_SETS if s.startswith("train.")]
    argv = [x for s in sets for x in ("--set", s)]
    assert import_(folder, run, *argv) == 0
    assert "continue training it with: taperlm train --out" in capsys.readouterr().out
    # the tokenizer is the folder's
    tok = load_any(run)[1]
    text = "the cat sat on the mat"
    assert tok.encode(text) == transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json")
    ).encode(text)
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "4"]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "export")]) == 0
    ids = _ids()
    exported, _, _ = load_any(tmp_path / "export")
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, hf_logits(folder, ids), atol=ATOL, rtol=0)
    # continue training, twice from the same imported run: the same weights
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for r in (run, copy):
        rc = main(["train", "--out", str(r), "--data", str(data), "--stop-after-steps", "2",
                   "--no-progress"])  # fmt: skip
        assert rc == 0, capsys.readouterr().err
    steps = [s for s, _ in store.list_checkpoints(run)]
    assert steps[-1] == 2
    a = store.load_model_state(store.list_checkpoints(run)[-1][1])
    b = store.load_model_state(store.list_checkpoints(copy)[-1][1])
    start = store.load_model_state(store.list_checkpoints(tmp_path / "copy")[0][1])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["blocks.0.mlp.w_in.weight"], _imported(folder)["blocks.0.mlp.w_in.weight"]
    )
    del start
    assert main(["eval", str(run), "--tasks", "val"]) == 0
    text_file = tmp_path / "text.txt"
    text_file.write_text(H.corpus_text(400))
    assert main(["novelty", str(run), "--data", str(text_file), "--tokens", "64"]) == 0


def _imported(folder: Path) -> dict[str, torch.Tensor]:
    from taperlm.hf import llama

    return llama.to_taperlm(
        {
            k: v
            for k, v in transformers.LlamaForCausalLM.from_pretrained(folder).state_dict().items()
        },
        llama.model_config(folder),
    )


def test_continuing_on_data_of_another_tokenizer_is_refused(tmp_path, data, capsys):
    """The run's tokenizer is the checkpoint's: training it on data tokenized otherwise would
    silently change what every id means."""
    other = H.prepare_data(tmp_path / "other", seed=1, vocab=290)
    folder = make_hf(tmp_path / "hf", data)
    run = tmp_path / "run"
    sets = [x for s in H.TINY_SETS if s.startswith("train.") for x in ("--set", s)]
    assert import_(folder, run, "--set", "train.batch_tokens=100") == 2
    assert "train.batch_tokens (100) must be a positive multiple" in capsys.readouterr().err
    assert import_(folder, run, *sets) == 0
    rc = main(["train", "--out", str(run), "--data", str(other), "--stop-after-steps", "1",
               "--no-progress"])  # fmt: skip
    assert rc == 2
    assert "tokenizer" in capsys.readouterr().err
    assert [s for s, _ in store.list_checkpoints(run)] == [0]


def test_a_folder_without_tokenizer_imports_without_one(tmp_path, capsys):
    folder = make_hf(tmp_path / "hf", None)
    assert import_(folder, tmp_path / "run") == 0
    assert "the run has no tokenizer" in capsys.readouterr().out
    ids = _ids()
    torch.testing.assert_close(our_logits(tmp_path / "run", ids), hf_logits(folder, ids),
                               atol=ATOL, rtol=0)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# the way back: export --format llama


def test_llama_export_loads_in_transformers_and_imports_back(tmp_path, data, capsys):
    """A uniform run exported as a plain LlamaForCausalLM: transformers computes our logits
    without taperlm's code, and importing it gives back the very weights; a tapered run is
    refused (its per-layer widths need --format block-configs)."""
    run = tmp_path / "run"
    assert main([*H.train_argv(data, run), "--stop-after-steps", "1"]) == 0
    assert main(["export", str(run), "--format", "llama", "--out", str(tmp_path / "ll")]) == 0
    ids = torch.randint(0, 300, (2, 30), generator=torch.Generator().manual_seed(0))
    ours = our_logits(run, ids)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ll").eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours, atol=ATOL, rtol=0)
    assert import_(tmp_path / "ll", tmp_path / "back") == 0
    a, _ = load_run_model(run)
    b, _ = load_run_model(tmp_path / "back")
    assert a.config.mlp_widths == b.config.mlp_widths
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert load_any(tmp_path / "back")[1].encode("the cat") == load_any(run)[1].encode("the cat")
    assert main(["export", str(run), "--out", str(tmp_path / "ours")]) == 0
    capsys.readouterr()
    assert import_(tmp_path / "ours", tmp_path / "r3") == 2
    assert "this is a `taperlm export` folder" in capsys.readouterr().err
    tapered = tmp_path / "tapered"
    argv = [*H.train_argv(data, tapered, "model.taper.schedule=linear"), "--stop-after-steps", "1"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["export", str(tapered), "--format", "llama", "--out", str(tmp_path / "t")]) == 2
    assert "--format block-configs" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
