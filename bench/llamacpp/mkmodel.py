#!/usr/bin/env python3
"""Write a tiny random-weight llama GGUF that llama-server loads.

The weights are seeded noise (the answers are gibberish); what matters is
that llama-server runs it like a real model: real prefill and decode
compute, a real KV cache per slot, real prompt-cache reuse. The vocabulary is
an SPM one built for bench/workload's text (pseudo-words of three lower-case
letters and a space): every such word is exactly one token, so a workload's
token counts are the engine's token counts (plus a few for the chat template).

Usage: mkmodel.py OUT.gguf [--dim 128] [--layers 2] [--heads 2] [--seed 1]
"""
import argparse
import itertools
import string

import numpy as np
import gguf

SPACE = "\u2581"  # SentencePiece's word boundary


def vocab():
    """Tokens, scores and types: <unk> <s> </s>, 256 byte tokens, letters,
    and SPACE followed by 0 to 3 letters (longer pieces score higher, so the
    SPM merge reaches the whole word)."""
    toks = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        toks.append("<0x%02X>" % b)
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    letters = string.ascii_lowercase
    for c in letters:
        toks.append(c)
        scores.append(-10.0)
        types.append(gguf.TokenType.NORMAL)
    toks.append(SPACE)
    scores.append(-9.0)
    types.append(gguf.TokenType.NORMAL)
    for n in (1, 2, 3):
        for p in itertools.product(letters, repeat=n):
            toks.append(SPACE + "".join(p))
            scores.append(float(n))
            types.append(gguf.TokenType.NORMAL)
    return toks, scores, types


# A plain-text chat template: no special tokens, so every role header costs a
# few ordinary tokens and the prompt is the messages in order.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=0, help="feed-forward size (0: 2 x dim)")
    ap.add_argument("--ctx", type=int, default=32768, help="trained context length")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ff = a.ff or 2 * a.dim
    head_dim = a.dim // a.heads
    toks, scores, types = vocab()
    rng = np.random.default_rng(a.seed)

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    ones = lambda n: np.ones(n, dtype=np.float32)

    g = gguf.GGUFWriter(a.out, "llama")
    g.add_name("warmpath-tiny-llama")
    g.add_context_length(a.ctx)
    g.add_embedding_length(a.dim)
    g.add_block_count(a.layers)
    g.add_feed_forward_length(ff)
    g.add_head_count(a.heads)
    g.add_head_count_kv(a.heads)
    g.add_rope_dimension_count(head_dim)
    g.add_rope_freq_base(10000.0)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    g.add_vocab_size(len(toks))
    g.add_tokenizer_model("llama")
    g.add_token_list(toks)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_unk_token_id(0)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_add_bos_token(True)
    g.add_add_eos_token(False)
    g.add_add_space_prefix(True)
    g.add_chat_template(CHAT_TEMPLATE)

    # numpy shape (rows, cols) = (out, in); GGUF stores it reversed.
    g.add_tensor("token_embd.weight", w(len(toks), a.dim))
    for i in range(a.layers):
        p = "blk.%d." % i
        g.add_tensor(p + "attn_norm.weight", ones(a.dim))
        g.add_tensor(p + "attn_q.weight", w(a.dim, a.dim))
        g.add_tensor(p + "attn_k.weight", w(a.dim, a.dim))
        g.add_tensor(p + "attn_v.weight", w(a.dim, a.dim))
        g.add_tensor(p + "attn_output.weight", w(a.dim, a.dim))
        g.add_tensor(p + "ffn_norm.weight", ones(a.dim))
        g.add_tensor(p + "ffn_gate.weight", w(ff, a.dim))
        g.add_tensor(p + "ffn_up.weight", w(ff, a.dim))
        g.add_tensor(p + "ffn_down.weight", w(a.dim, ff))
    g.add_tensor("output_norm.weight", ones(a.dim))
    g.add_tensor("output.weight", w(len(toks), a.dim))

    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print("wrote %s: llama, dim %d, %d layers, %d heads, ff %d, vocab %d, seed %d"
          % (a.out, a.dim, a.layers, a.heads, ff, len(toks), a.seed))


if __name__ == "__main__":
    main()
