"""Train a Hugging Face model under an asymmetric plan, end to end, with nothing downloaded
(`make example-hf`; docs/models-and-data.md §12):

1. make a tiny Llama (GQA: 4 heads, 2 kv heads) with transformers and save it, with a
   byte-level BPE tokenizer trained on the bundled text by the tokenizers library;
2. a problem whose model is that folder (`model: {hf: model}`) on the demo cluster, and an
   asymmetric plan: pipeline 0 holds 6 of 8 sequences on a TP 2 stage of 3 layers and a
   TP 1 stage of 1, pipeline 1 the other 2 on one device with all 4 layers;
3. `hexiscale run --init-from model --data train.txt --eval-data eval.txt --save-hf trained`
   on 4 local processes (the bundled text split 9:1);
4. load the trained folder with transformers' from_pretrained and continue a prompt.

    .venv/bin/python examples/hf_tiny.py [--folder .example-hf] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "runtime" / "model" / "data" / "corpus.txt"
PLAN = {"format": "hexiscale.plan/1", "problem": "example-hf", "pipelines": [
    {"batch": 6, "stages": [{"devices": [0, 1], "layers": 3}, {"devices": [2], "layers": 1}]},
    {"batch": 2, "stages": [{"devices": [3], "layers": 4}]}]}


def make_model(folder: Path) -> None:
    """A random tiny Llama and a tokenizer of 300 tokens (<eos> is id 0) trained on the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, eos_token_id=0, bos_token_id=None,
                         pad_token_id=None, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([TEXT.read_text()], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(folder / "tokenizer.json"))


def write_inputs(folder: Path) -> None:
    """The problem, the plan, and the text split 9:1 at a paragraph into train and eval."""
    (folder / "problem.yaml").write_text(yaml.safe_dump({
        "name": "example-hf", "cluster": "demo-4", "model": {"hf": "model"},
        "training": {"seq_len": 64, "global_batch": 8, "micro_batch": 1, "recompute": False}}))
    (folder / "plan.json").write_text(json.dumps(PLAN, indent=1))
    text = TEXT.read_text()
    cut = text.rfind("\n\n", 0, len(text) * 9 // 10) + 2
    (folder / "train.txt").write_text(text[:cut])
    (folder / "eval.txt").write_text(text[cut:])


def continue_prompt(folder: Path, prompt: str) -> str:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False).ids])
    out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=0, pad_token_id=0)
    return tokenizer.decode(out[0].tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=ROOT / ".example-hf")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    folder = args.folder
    folder.mkdir(parents=True, exist_ok=True)
    make_model(folder / "model")
    write_inputs(folder)
    command = [str(Path(sys.executable).parent / "hexiscale"), "run", str(folder / "problem.yaml"),
               str(folder / "plan.json"), "--init-from", str(folder / "model"), "--data", str(folder / "train.txt"),
               "--eval-data", str(folder / "eval.txt"), "--eval-every", "10", "--steps", str(args.steps),
               "--lr", "3e-3", "--save-hf", str(folder / "trained"), "--out", str(folder / "run")]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env={"HEXISCALE_CACHE": str(folder / "cache"), **os.environ})
    prompt = "A cluster is"
    print(f"the trained model, loaded with transformers, continues {prompt!r}:",
          repr(continue_prompt(folder / "trained", prompt)))


if __name__ == "__main__":
    main()
