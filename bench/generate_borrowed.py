"""Whether a model samples as fast from a shared-memory segment's pages as from weights of its own
(what a model server on the trainer's host serves from once it takes versions without a copy).

    python bench/generate_borrowed.py MODEL_DIR [--repeats 3] [--tokens 48]

Greedy generation for 4 prompts on one thread, first from the model's own weights, then after every
weight is pointed at a private map of a segment holding the same bytes (``corl.transfer.shared``, as
``Slot._adopt`` does, with its ``point_at``); prints the best of the repeats of each.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from corl.services.model.backends.slots import point_at
from corl.transfer import shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a save_pretrained directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    inputs = tok(["Q: 12+34*2 = ? Think step by step.\nA:"] * 4, return_tensors="pt")

    def best() -> float:
        times = []
        for _ in range(args.repeats + 1):  # the first warms up
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(**inputs, max_new_tokens=args.tokens, do_sample=False, pad_token_id=tok.eos_token_id)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    own = best()
    state = dict(model.state_dict())
    segment = shared.Segment.create("bench", state)
    try:
        for name, t in state.items():
            segment.views[name].copy_(t)
        like = [(t.dtype, tuple(t.shape)) for t in state.values()]
        fd = shared.open_segment(segment.ref, shared.sizes_of(like))
        point_at(model, list(state), shared.views(shared.borrow(fd), like))
        del state
        borrowed = best()
    finally:
        segment.unlink()
    print(f"own weights {own:.3f} s, a segment's pages {borrowed:.3f} s (best of {args.repeats})")


if __name__ == "__main__":
    main()
