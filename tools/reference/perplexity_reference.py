#!/usr/bin/env python3
"""Regenerate tests/fixtures/perplexity/perplexity.json: perplexity computed llama.cpp's way
from Hugging Face transformers' logits, on tiny `tessera synth` checkpoints.

    tools/reference/perplexity_reference.py                  # with build/tessera
    tools/reference/perplexity_reference.py --tessera PATH

For each case (a tiny preset made by `tessera synth --preset P --tiny --seed 0`, a context
N_CTX and TEXT), independently of tessera's code:
  - ids: `tokenizers` on the checkpoint's tokenizer.json, encode(TEXT, add_special_tokens=False),
    with BOS first when llama.cpp would add one to this checkpoint (see adds_bos);
  - chunks: n_chunks = len(ids) // N_CTX non-overlapping chunks; each runs alone (an empty
    cache: positions 0..N_CTX-1) with its first token replaced by BOS when BOS is added;
  - scored: logits at positions first = N_CTX // 2 .. N_CTX - 2 against the next token of the
    original ids, nll = -log_softmax(logits in float64)[target];
  - ppl = exp(mean nll); ppl_error = ppl * sqrt((mean nll^2 - mean nll ^ 2) / (count - 1)),
    the "+/-" figure of llama.cpp's llama-perplexity (tools/perplexity/perplexity.cpp).
transformers runs in float32, CPU, eager attention (hf_reference.load_model). The fixture
also records the largest logit range over the scored rows (the C++ test's tolerance is
derived from it) and the figures a few plausible mistakes would give ("variants": the test
checks that its tolerance tells each of them from the right answer). tests/test_perplexity.cc
reads it. See README.md.
"""
import argparse
import math
import sys
import tempfile
from pathlib import Path

import hf_reference as ref
from tokenizers import Tokenizer

SEED = 0
# Short enough to keep the fixture small and the test fast; long enough for several chunks.
TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk, carrying a lamp, a "
    "notebook and a small tin of oil. From the gallery at the top he could see the whole bay: the "
    "fishing boats coming home, the gulls circling over the harbour, and the long grey line of the "
    "cliffs running north toward the old town. He wrote down the wind, the colour of the sky and "
    "the number of ships that passed, as his father had done for forty-one years before him. On "
    "stormy nights the beam swept across the water every 12 seconds, and sailors said they could "
    "count on it like a heartbeat. When the new automatic light was installed in 1987, he kept "
    "climbing the stairs anyway, because, as he told the engineers, somebody ought to be there to "
    "watch the sea.\n"
)
CASES = [
    {"preset": "SmolLM2-360M", "n_ctx": 32},  # no BOS (add_bos_token false)
    {"preset": "Llama-3.2-1B", "n_ctx": 32},  # BOS added: each chunk starts with <|begin_of_text|>
]
OUT = ref.FIXTURES / "perplexity" / "perplexity.json"


def adds_bos(model_dir, tok):
    """llama.cpp's add_bos for this checkpoint converted by its convert_hf_to_gguf.py:
    tokenizer_config.json's add_bos_token; else whether the tokenizer.json post-processor
    puts BOS first; else llama.cpp's default for the pre-tokenizer type (src/llama-vocab.cpp:
    true for Llama 3's "llama-bpe", whose BOS is <|begin_of_text|>; false for SmolLM2's
    "smollm" and for Qwen2)."""
    import json
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    bos_token = cfg.get("bos_token")
    if isinstance(bos_token, dict):
        bos_token = bos_token.get("content")
    bos_id = tok.token_to_id(bos_token) if bos_token else None
    if isinstance(cfg.get("add_bos_token"), bool):
        return cfg["add_bos_token"] and bos_id is not None, bos_id
    if bos_id is None:
        return False, None
    if tok.encode("x", add_special_tokens=True).ids[:1] == [bos_id]:
        return True, bos_id
    return bos_token == "<|begin_of_text|>", bos_id


def stats(nlls):
    """(ppl, ppl_error, mean, mean of squares) the way llama.cpp's perplexity() ends."""
    count = len(nlls)
    mean = sum(nlls) / count
    mean2 = sum(v * v for v in nlls) / count
    ppl = math.exp(mean)
    var = mean2 - mean * mean
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else float("nan")
    return ppl, err, mean, mean2


@ref.torch.no_grad()
def chunk_logits(model, chunk):
    """float64 logits [n_ctx, vocab] of one chunk run alone from position 0."""
    return model(ref.torch.tensor([chunk]), use_cache=False).logits[0].double()


def nll_rows(logits, rows, targets):
    lsm = ref.torch.log_softmax(logits, dim=-1)
    return [-float(lsm[r, t]) for r, t in zip(rows, targets)]


def make_case(tessera, preset, n_ctx):
    with tempfile.TemporaryDirectory(prefix="tessera-synth-") as tmp:
        tmp = Path(tmp)
        ref.tessera(tessera, "synth", "--preset", preset, "--tiny", "--seed", SEED, "--out", tmp)
        digest = ref.sha256_file(tmp / "model.safetensors")
        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
        add_bos, bos_id = adds_bos(tmp, tok)
        ids = tok.encode(TEXT, add_special_tokens=False).ids
        if add_bos:
            ids = [bos_id] + ids
        if len(ids) < 2 * n_ctx:
            sys.exit(f"{preset}: TEXT gives {len(ids)} tokens, fewer than 2 x {n_ctx}")
        model = ref.load_model(tmp)

        n_chunks = len(ids) // n_ctx
        first = n_ctx // 2
        nlls, running, logit_range = [], [], 0.0
        wrong = {"targets_off_by_one": [], "score_whole_chunk": [], "bos_not_replaced": []}
        for c in range(n_chunks):
            start = c * n_ctx
            orig = ids[start:start + n_ctx]
            chunk = ([bos_id] + orig[1:]) if add_bos else list(orig)
            logits = chunk_logits(model, chunk)
            rows = list(range(first, n_ctx - 1))
            nlls += nll_rows(logits, rows, [orig[r + 1] for r in rows])
            running.append(math.exp(sum(nlls) / len(nlls)))
            scored = logits[first:n_ctx - 1]
            logit_range = max(logit_range, float((scored.max(dim=-1).values - scored.min(dim=-1).values).max()))
            # Mistakes the test must be able to tell from the right answer.
            wrong["targets_off_by_one"] += nll_rows(logits, rows, [orig[r] for r in rows])
            all_rows = list(range(0, n_ctx - 1))
            wrong["score_whole_chunk"] += nll_rows(logits, all_rows, [orig[r + 1] for r in all_rows])
            if add_bos:
                raw = chunk_logits(model, list(orig)) if c > 0 else logits  # chunk 0 starts with BOS anyway
                wrong["bos_not_replaced"] += nll_rows(raw, rows, [orig[r + 1] for r in rows])
        ppl, err, mean, mean2 = stats(nlls)
        variants = {k: stats(v)[0] for k, v in wrong.items() if v}
        variants["ppl_error_without_count_minus_1"] = math.sqrt((mean2 - mean * mean) / len(nlls)) * ppl
        print(f"{preset}: {len(ids)} ids (BOS {'added' if add_bos else 'not added'}), {n_chunks} chunks of {n_ctx}, "
              f"{len(nlls)} scored: PPL = {ppl:.4f} +/- {err:.5f}; logit range {logit_range:.3f}; "
              f"variants {', '.join(f'{k} {v:.4f}' for k, v in variants.items())}")
        return {
            "source": {"preset": preset, "tiny": True, "seed": SEED},
            "checkpoint_sha256": digest,
            "n_ctx": n_ctx,
            "add_bos": add_bos,
            "bos_id": bos_id if add_bos else None,
            "ids": ids,
            "chunks": n_chunks,
            "tokens_scored": len(nlls),
            "ppl": ppl,
            "ppl_error": err,
            "mean_nll": mean,
            "mean_nll2": mean2,
            "running_ppl": running,
            "max_scored_logit_range": logit_range,
            "variants": variants,
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default=ref.DEFAULT_TESSERA, help="tessera binary (default: build/tessera)")
    args = ap.parse_args()
    cases = [make_case(args.tessera, c["preset"], c["n_ctx"]) for c in CASES]
    fx = {
        "what": "perplexity computed as llama.cpp's llama-perplexity does, from transformers' logits "
                "(tools/reference/perplexity_reference.py)",
        "transformers_version": ref.transformers.__version__,
        "torch_version": ref.torch.__version__,
        "settings": {"dtype": "float32 model, float64 log-softmax", "device": "cpu", "attn_implementation": "eager"},
        "text": TEXT,
        "text_note": "the text as llama.cpp reads a file minus its one trailing newline: TEXT ends with '\\n', "
                     "which a file holding TEXT + '\\n' keeps",
        "cases": cases,
    }
    print(f"wrote {ref.write_fixture(OUT, fx)}")


if __name__ == "__main__":
    main()
