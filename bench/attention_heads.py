"""Attention heads of the default model (all-MiniLM-L6-v2), in the manner of Clark et al. (2019):

1. where each head attends over a corpus (shares to [CLS], [SEP], itself, its neighbours; entropy),
   on the first N texts of ../shared/bench/sentences.txt, truncated to 128 tokens;
2. which heads link a pronoun to its antecedent, on the 24 hand-written examples of
   tests/data/pronoun_antecedents.jsonl (16 Winograd-style minimal pairs, 8 where number or gender
   decides), with honest baselines: chance, the candidate nearest the pronoun, a leave-one-out choice
   of the best head (choosing the best of 72 heads on the same 24 examples flatters it) and the chance
   that the best of 72 coin-flipping heads would do as well.

    python bench/attention_heads.py [--texts 1000]

Writes bench/results/attention_heads.json and the reports (Markdown + PNG) in bench/results/attention/.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from common import RESULTS, ROOT, SHARED, require, smoke_size, write_result


def leave_one_out(per_example: np.ndarray, attention: np.ndarray) -> float:
    """Accuracy of the head chosen on all other examples, on the example left out, averaged.

    ``per_example``: (examples, layers, heads) 0/1 hits; ``attention``: (examples, layers, heads) attention to
    the antecedent, the tie-breaker (as in the ranking)."""
    hits = []
    for left_out in range(per_example.shape[0]):
        rest = np.delete(np.arange(per_example.shape[0]), left_out)
        accuracy, tie = per_example[rest].mean(0).ravel(), attention[rest].mean(0).ravel()
        best = np.lexsort((-tie, -accuracy))[0]
        hits.append(per_example[left_out].ravel()[best])
    return float(np.mean(hits))


def best_of_coin_flips(heads: int, examples: int, observed: float) -> float:
    """P(the best of ``heads`` independent heads that are right half the time scores >= ``observed``)."""
    needed = math.ceil(observed * examples - 1e-9)
    one = sum(math.comb(examples, k) for k in range(needed, examples + 1)) / 2 ** examples
    return 1 - (1 - one) ** heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000, help="texts of sentences.txt for the head statistics")
    args = parser.parse_args()

    from encoderkit.analysis import AttentionAnalyzer

    out_dir = RESULTS / "attention"
    analyzer = AttentionAnalyzer.from_pretrained(None, max_length=128)
    write_result("attention_heads", {
        "model": "all-MiniLM-L6-v2",
        # A smoke run: the statistics over 8 texts (the 24 pronoun examples stay: they are few already).
        "statistics": head_statistics(analyzer, smoke_size(args.texts, 8), out_dir),
        "antecedents": antecedent_heads(analyzer, out_dir),
    })


def head_statistics(analyzer, count: int, out_dir) -> dict:
    """1. Where each head attends over the first ``count`` texts of sentences.txt."""
    texts = [t for t in require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()
             if t.strip()][:count]
    start = time.perf_counter()
    stats = analyzer.head_statistics(texts)
    stats_seconds = time.perf_counter() - start
    stats.write(out_dir)
    print(f"head statistics over {stats.num_texts} texts ({stats.mean_tokens:.1f} tokens on average), "
          f"{stats_seconds:.1f} s")
    print(f"{'category':12s}  mean over heads  top heads (layer-head: share)")
    stat_rows = []
    for name in [*stats.categories, "entropy"]:
        values = stats.entropy if name == "entropy" else stats.shares[name]
        top = stats.top_heads(name, 3)
        stat_rows.append({"category": name, "mean": float(values.mean()),
                          "top": [{"layer": l, "head": h, "value": v} for l, h, v in top]})
        print(f"{name:12s}  {values.mean():15.3f}  " + ", ".join(f"{l}-{h}: {v:.3f}" for l, h, v in top))
    print(f"(entropy of uniform attention: {stats.uniform_entropy:.3f} nats)")
    return {"texts": stats.num_texts, "mean_tokens": stats.mean_tokens, "max_length": 128,
            "seconds": stats_seconds, "uniform_entropy": stats.uniform_entropy, "rows": stat_rows}


def antecedent_heads(analyzer, out_dir) -> dict:
    """2. Which heads link a pronoun to its antecedent, against the baselines."""
    from encoderkit.analysis import find_antecedent_heads, read_coreference_examples
    from encoderkit.analysis.antecedents import score_example

    fixture = ROOT / "tests" / "data" / "pronoun_antecedents.jsonl"
    examples = read_coreference_examples(fixture)
    kinds = [json.loads(line)["kind"] for line in fixture.read_text().splitlines() if line.strip()]
    result = find_antecedent_heads(analyzer, examples, top_k=5, rank_by="candidate_accuracy")
    result.write(out_dir)
    maps = analyzer.attend_many([e.sentence for e in examples])
    scores = [score_example(m, e) for m, e in zip(maps, examples)]
    candidate_hits = np.array([s.to_antecedent > s.to_distractors.max(-1) for s in scores], dtype=float)
    argmax_hits = np.array([s.hit for s in scores], dtype=float)
    attention = np.array([s.to_antecedent for s in scores])
    layers, heads = result.num_layers, result.num_heads
    best = result.top[0]
    print(f"\npronoun -> antecedent over {len(examples)} examples ({layers * heads} heads); chance: candidate "
          f"{result.candidate_chance:.3f}, nearest candidate {result.nearest_candidate_accuracy:.3f}, "
          f"random word {result.chance_accuracy:.3f}")
    print(f"{'head':6s} {'candidate acc':>13s} {'argmax acc':>10s} {'attention':>9s} {'x chance':>8s}"
          f" {'winograd':>8s} {'agreement':>9s}")
    rows = []
    for score in result.top:
        per_kind = {kind: float(candidate_hits[[k == kind for k in kinds], score.layer, score.head].mean())
                    for kind in ("winograd", "agreement")}
        rows.append({**vars(score), "candidate_accuracy_by_kind": per_kind})
        print(f"{score.layer}-{score.head:<4d} {score.candidate_accuracy:13.3f} {score.accuracy:10.3f} "
              f"{score.mean_attention:9.3f} {score.attention_lift:8.2f} {per_kind['winograd']:8.3f} "
              f"{per_kind['agreement']:9.3f}")
    winograd = [i for i, k in enumerate(kinds) if k == "winograd"]
    pairs_both_right = int(sum(candidate_hits[i, best.layer, best.head] * candidate_hits[i + 1, best.layer, best.head]
                               for i in winograd[::2]))
    loo_candidate = leave_one_out(candidate_hits, attention)
    loo_argmax = leave_one_out(argmax_hits, attention)
    p_best = best_of_coin_flips(layers * heads, len(examples), best.candidate_accuracy)
    picks_a_candidate = float(np.mean([s.words[int(s.predicted_word[best.layer, best.head])].lower() in
                                       {str(e.antecedent).lower(), *(str(d).lower() for d in e.distractors)}
                                       for s, e in zip(scores, examples)]))
    print(f"best head {best.layer}-{best.head}: right on both sentences of {pairs_both_right} of {len(winograd) // 2} "
          f"Winograd pairs; its most-attended word is one of the two candidates in {100 * picks_a_candidate:.0f}% "
          "of the examples")
    print(f"head chosen leave-one-out: candidate accuracy {loo_candidate:.3f}, argmax accuracy {loo_argmax:.3f}")
    print(f"P(best of {layers * heads} coin-flip heads >= {best.candidate_accuracy:.3f} on {len(examples)} examples): "
          f"{p_best:.2f}")
    return {
        "examples": len(examples), "kinds": {k: kinds.count(k) for k in sorted(set(kinds))},
        "heads": layers * heads, "ranked_by": "candidate_accuracy", "rows": rows,
        "candidate_chance": result.candidate_chance,
        "nearest_candidate_accuracy": result.nearest_candidate_accuracy,
        "random_word_chance": result.chance_accuracy, "chance_attention": result.chance_attention,
        "best_head_winograd_pairs_both_right": pairs_both_right, "winograd_pairs": len(winograd) // 2,
        "best_head_picks_a_candidate": picks_a_candidate,
        "leave_one_out_candidate_accuracy": loo_candidate, "leave_one_out_argmax_accuracy": loo_argmax,
        "p_best_of_coin_flip_heads": p_best,
    }


if __name__ == "__main__":
    main()
