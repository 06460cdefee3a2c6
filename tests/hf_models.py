"""Tiny Hugging Face models made here with transformers (no hub), a tokenizer trained with the
tokenizers library on the bundled text, and the one-process transformers training loop on
the batches of docs/models-and-data.md §12 that the runtime's runs are compared with."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from runtime.model.data import CORPUS_PATH

VOCAB = 320  # the tokenizer's 300 tokens fit; divisible by TP 2
EOS = 0
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": VOCAB, "eos_token_id": EOS, "bos_token_id": None,
         "pad_token_id": None, "rms_norm_eps": 1e-6, "max_position_embeddings": 256}


def train_tokenizer(path: Path, text: str, size: int = 300) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    tokenizer.save(str(path))


def make_model(folder: Path, family: str, tied: bool = False, seed: int = 0, **changes) -> Path:
    """A random model of `family` (llama | qwen2) saved with save_pretrained, its tokenizer
    beside it; qwen2's q/k/v biases are random too (transformers starts them at zero)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config_type, model_type = {"llama": (LlamaConfig, LlamaForCausalLM),
                               "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    model = model_type(config_type(**{"rope_theta": 5000.0, **SIZES, **changes}, tie_word_embeddings=tied))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:  # not the ones and zeros of a fresh model
                param.add_(torch.randn_like(param) * 0.05)
    model.save_pretrained(folder)
    train_tokenizer(folder / "tokenizer.json", CORPUS_PATH.read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return folder


def folder_problem(root: Path, name: str, family: str, *, tied: bool = False, **training) -> Path:
    """A model folder `root/name` of `family` and its problem `root/name.yaml` on the bundled
    demo-4 cluster: micro-batch 1, no recompute, and `training` (seq_len, global_batch, …)."""
    make_model(root / name, family, tied=tied)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "cluster": "demo-4", "model": {"hf": name},
                                    "training": {"micro_batch": 1, "recompute": False, **training}}))
    return path


def write_jsonl(path: Path, text: str) -> Path:
    """The text's paragraphs as documents of a .jsonl file."""
    docs = [p for p in text.split("\n\n") if p.strip()]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def stream_of(path: Path, folder: Path) -> list[int]:
    """§12's stream, computed here independently: each document's ids, then eos."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    docs = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return [i for doc in docs for i in (*tokenizer.encode(doc, add_special_tokens=False).ids, EOS)]


def batch(stream: list[int], step: int, global_batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of step t: sequence j is stream[o : o + s + 1], o = (t·B + j)·s mod (len − s − 1)."""
    rows = []
    for j in range(global_batch):
        start = (step * global_batch + j) * seq_len % (len(stream) - seq_len - 1)
        rows.append(stream[start:start + seq_len + 1])
    rows = torch.tensor(rows)
    return rows[:, :-1], rows[:, 1:]


def train_transformers(folder: Path, stream: list[int], *, steps: int, global_batch: int, seq_len: int,
                       lr: float, weight_decay: float, clip_grad: float | None = None,
                       grad_norms: list[float] | None = None):
    """The one-process loop: per-step losses (before each update) and the trained model;
    `clip_grad`: torch's clip_grad_norm_ before each update, each step's norm before clipping
    appended to `grad_norms`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for step in range(steps):
        inputs, targets = batch(stream, step, global_batch, seq_len)
        loss = F.cross_entropy(model(inputs).logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        if clip_grad is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
            if grad_norms is not None:
                grad_norms.append(float(norm))
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def relative_distance(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """‖Δ‖/‖ref‖ over all tensors together (§12's "equal to 1e-5")."""
    assert set(ours) == set(reference), set(ours) ^ set(reference)
    delta = sum(float((ours[n].double() - reference[n].double()).pow(2).sum()) for n in reference)
    norm = sum(float(reference[n].double().pow(2).sum()) for n in reference)
    return (delta / norm) ** 0.5
