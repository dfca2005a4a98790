#!/usr/bin/env python3
"""Regenerate the greedy generation fixture in tests/fixtures/generation/ with transformers.

    tools/reference/generation_fixtures.py                       # write the fixture
    tools/reference/generation_fixtures.py --tessera build/tessera --check-k 0,1,8,31

The default GGUF (SmolLM2-135M-Instruct, dequantized by transformers, float32, CPU,
eager attention) generates NEW_TOKENS tokens greedily for each prompt of PROMPTS, rendered
by the GGUF's chat template (no system message: the template adds its default) and
tokenized by `tokenizers` on the tokenizer.json that `tessera synth` writes from the GGUF.
Generation never stops early: a KV-cache loop of plain argmax steps (no EOS stop, no
repetition penalty, no sampling); `eos_at` is the index of the first generated EOS
(<|im_end|> or <|endoftext|>), or null. Every step is re-checked with a full forward pass without KV cache, and, unless
--no-check, tessera's oracle (`tessera dump`) must give the same argmax after
prompt_ids + the first k generated ids, for every k (or those of --check-k). See README.md.
"""
import argparse
import inspect
import sys
import tempfile
from pathlib import Path

import hf_reference as ref
import numpy as np
from tokenizers import Tokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
NEW_TOKENS = 32
OUT = ref.FIXTURES / "generation" / "smollm2-135m-instruct.json"
EOS_TOKENS = ["<|im_end|>", "<|endoftext|>"]


@ref.torch.no_grad()
def greedy(model, prompt_ids, n):
    """n greedy tokens, one forward per step with the KV cache, never stopping early.

    A plain loop rather than model.generate: generate() still stops at the model's EOS
    (from its own generation config) when given eos_token_id=None.
    """
    # The cache argument is `cache` from transformers 5.x on, `past_key_values` before.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(ref.torch.tensor([prompt_ids]), use_cache=True)
    generated = []
    for _ in range(n):
        generated.append(int(out.logits[0, -1].argmax()))
        if len(generated) == n:
            break
        out = model(ref.torch.tensor([[generated[-1]]]), use_cache=True, **{key: out.past_key_values})
    return generated


@ref.torch.no_grad()
def recheck(model, prompt_ids, generated):
    """Full forward without cache: argmax at every step; returns the top-1 minus top-2 margins."""
    ids = prompt_ids + generated
    logits = model(ref.torch.tensor([ids]), use_cache=False).logits[0].float()
    margins = []
    for k, want in enumerate(generated):
        row = logits[len(prompt_ids) + k - 1]
        top2 = ref.torch.topk(row, 2)
        if int(top2.indices[0]) != want:
            sys.exit(f"step {k}: the full forward's argmax {int(top2.indices[0])} differs from "
                     f"the cached loop's {want} (margin {float(top2.values[0] - top2.values[1]):.3g})")
        margins.append(round(float(top2.values[0] - top2.values[1]), 4))
    return margins


def tessera_argmax(binary, gguf, ids, tmp):
    ref.tessera(binary, "dump", gguf, "--ids", ",".join(map(str, ids)), "--out", tmp,
                "--probes", "layers", "--threads", "2")
    return int(np.load(Path(tmp) / "logits.npy")[-1].argmax())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default=ref.DEFAULT_TESSERA, help="tessera binary (default: build/tessera)")
    ap.add_argument("--gguf", type=Path, default=ref.DEFAULT_GGUF, help="GGUF (default: the default model)")
    ap.add_argument("--check-k", default="all",
                    help="comma-separated prefix lengths k for the tessera dump cross-check "
                         "(default: all, 0 to NEW_TOKENS - 1)")
    ap.add_argument("--no-check", action="store_true", help="skip the tessera dump cross-check")
    args = ap.parse_args()
    if not args.gguf.exists():
        sys.exit(f"{args.gguf} is missing: run scripts/setup.sh")

    hf_tok = ref.AutoTokenizer.from_pretrained(args.gguf.parent, gguf_file=args.gguf.name)
    with tempfile.TemporaryDirectory(prefix="tessera-synth-") as tmp:
        tok = Tokenizer.from_file(str(ref.synth_smollm2_tokenizer(args.tessera, tmp) / "tokenizer.json"))
    eos_ids = {tok.token_to_id(t) for t in EOS_TOKENS}
    model = ref.load_model(args.gguf)

    cases = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok.encode(rendered, add_special_tokens=False).ids
        if prompt_ids != hf_tok(rendered, add_special_tokens=False)["input_ids"]:
            sys.exit(f"{prompt!r}: tokenizers and transformers' GGUF tokenizer disagree on the prompt")
        generated = greedy(model, prompt_ids, NEW_TOKENS)
        margins = recheck(model, prompt_ids, generated)
        eos_at = next((i for i, t in enumerate(generated) if t in eos_ids), None)
        cases.append({
            "prompt": prompt,
            "messages": messages,
            "rendered": rendered,
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "generated_text": tok.decode(generated, skip_special_tokens=False),
            "eos_at": eos_at,
            "margins": margins,
        })
        print(f"{prompt!r}: {len(prompt_ids)} prompt ids, eos_at {eos_at}, min margin {min(margins):.4f} "
              f"(step {margins.index(min(margins))}): {cases[-1]['generated_text']!r}")

    fx = {
        "model": args.gguf.name,
        "gguf_sha256": ref.sha256_file(args.gguf),
        "transformers_version": ref.transformers.__version__,
        "torch_version": ref.torch.__version__,
        "settings": {"dtype": "float32", "device": "cpu", "attn_implementation": "eager",
                     "do_sample": False, "repetition_penalty": 1.0, "max_new_tokens": NEW_TOKENS,
                     "stop_on_eos": False, "eos_ids": sorted(eos_ids)},
        "prompt_ids": "tokenizers encode(chat template rendering, add_special_tokens=False)",
        "margins": "top-1 minus top-2 logit at each generated step (full forward, no cache)",
        "cases": cases,
    }
    print(f"wrote {ref.write_fixture(OUT, fx)}")

    if args.no_check:
        return
    ks = range(NEW_TOKENS) if args.check_k == "all" else [int(k) for k in args.check_k.split(",")]
    bad = 0
    for case in cases:
        got = []
        for k in ks:
            with tempfile.TemporaryDirectory(prefix="tessera-dump-") as tmp:
                top = tessera_argmax(args.tessera, args.gguf, case["prompt_ids"] + case["generated_ids"][:k], tmp)
            want = case["generated_ids"][k]
            if top != want:
                got.append(f"k={k}: {top} != {want} (margin {case['margins'][k]})")
            bad += top != want
        print(f"tessera dump argmax, {case['prompt']!r}, k in {list(ks)[0]}..{list(ks)[-1]} "
              f"({len(ks)} steps): {'; '.join(got) or 'all equal'}")
    if bad:
        sys.exit(f"tessera's oracle disagrees with transformers at {bad} checked steps")
    print(f"tessera's oracle agrees at all {len(ks) * len(cases)} checked steps")


if __name__ == "__main__":
    main()
