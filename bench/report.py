"""Regenerate BENCHMARKS.md from bench/results/*.json (never edit BENCHMARKS.md by hand).

    python -m bench report [--skip-invalid] [--out PATH]     (or, in bench/: python report.py ...)

A result is shown only with its provenance and a verdict for each of its goals (bench/registry.result_problems):
without them a number cannot be told apart from a stale or unchecked one, so the report refuses to write, naming
the file, or with ``--skip-invalid`` leaves it out with a warning. Sections are grouped by the registry's kinds.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from common import RESULTS, ROOT
from registry import BY_RESULT, KINDS, load_result


def _machine(result: dict[str, Any]) -> str:
    m = result["machine"]
    flags = m.get("cpu_flags")
    units = [name for name in ("avx512_bf16", "amx_bf16") if flags and flags.get(name)]
    if not m.get("native_bf16"):
        bf16 = "no native bf16 (bf16 products emulated)"
    elif units:
        bf16 = "native bf16 through " + " and ".join(units)
    else:
        bf16 = "native bf16 (this result did not record whether through avx512_bf16 or amx_bf16)"
    shown = (" (CPU flags: " + ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in flags.items())
             + ")") if flags else ""
    made = result.get("provenance")
    command = result.get("command") or (made or {}).get("command") or f"python bench/{result['benchmark']}.py"
    if made and made.get("commit"):
        commit = f" Commit {made['commit'][:10]}{' with uncommitted changes' if made['dirty'] else ''}."
    elif made and made.get("recorded_in"):  # bench/backfill_provenance.py
        commit = (f" Measured before results named their commit; recorded in commit {made['recorded_in'][:10]} "
                  f"(\"{made['recorded_subject'][:90]}\").")
    else:
        commit = " (no provenance recorded: measured before results named their commit)"
    environment = (made or {}).get("environment")
    limited = (" Run with `" + " ".join(f"{name}={value}" for name, value in environment.items()) + "`: the "
               "instructions its kernels used, not all of the CPU's flags above (a smaller tier imitated where they "
               "name one).") if environment else ""
    return (f"_{result['date']}: {m['cpu']}{shown}, {m['threads']} threads, {bf16}, torch {m['torch']}. "
            f"Command: `{command}`.{commit}{limited}_")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render_encode(r: dict[str, Any]) -> list[str]:
    peaks = r["mm_peak_gflops"]
    lines = [
        "## Encoding speed (`bench/encode.py`)", "", _machine(r), "",
        f"{r['texts']:,} texts from `../shared/bench/sentences.txt`, {r['tokens']:,} real tokens after truncation "
        f"to 256, {r['tflop_per_pass']:.2f} TFLOP per pass. Measured `torch.mm` peak on this machine: "
        f"fp32 {peaks['fp32']:.0f} GFLOP/s, bf16 {peaks['bf16']:.0f} GFLOP/s. Median of {r['repeats']} interleaved "
        "repeats; the speed-up is the median of per-repeat ratios against sentence-transformers "
        "`encode(batch_size=32)` (fp32).", "",
    ]
    rows = []
    for row in r["rows"]:
        sts = row.get("sts_dev_spearman")
        rows.append([row["contender"], f"{row['texts_per_second']:,.0f}", f"{row['tokens_per_second']:,.0f}",
                     f"{row['gflops_per_second']:.0f}" + (f" ({100 * row['share_of_mm_peak']:.0f}%)"
                                                          if row.get("share_of_mm_peak") else " (int8: no fp peak)"),
                     f"**{row['speedup_vs_sentence_transformers']:.2f}x**",
                     f"{row['max_abs_diff_vs_sentence_transformers']:.1e}",
                     "" if sts is None else f"{100 * sts:.2f}"])
    lines += _table(["contender", "texts/s", "tokens/s", "GFLOP/s (of mm peak)", "vs ST", "max abs diff vs ST",
                     "STS-B dev Spearman x100"], rows)
    compile_time = r.get("compile_first_pass_seconds")
    if compile_time is not None:
        shown = f"{compile_time:.0f} s" if isinstance(compile_time, (int, float)) else compile_time
        lines += ["", f"torch.compile: first pass (compilation included) took {shown}."]
    return lines + [""]


def render_search(r: dict[str, Any]) -> list[str]:
    lines = ["## Search indexes (`bench/search.py`)", "", _machine(r), "", r.get("description", ""), ""]
    rows = [[row["data"], row["index"], f"{row['build_seconds']:.1f}", f"{row['query_ms']:.2f}",
             f"{row['recall_at_10']:.3f}", f"{row['bytes_per_vector']:.0f}"] for row in r["rows"]]
    return lines + _table(["data", "index", "build s", "ms / query", "recall@10", "bytes / vector"], rows) + [""]


def render_pretrain(r: dict[str, Any]) -> list[str]:
    lines = ["## Pre-training per wall-clock (`bench/pretrain.py`)", "", _machine(r), "",
             f"A 4-layer, hidden-256 BERT with the MiniLM vocabulary, sequences of {r['sequence_length']} tokens "
             f"({r['training_sequences']:,} packed from `mlm_corpus/train.txt`), batch {r['batch_size']}, same initial "
             f"weights and optimiser settings. Each contender trained for {r['budget_minutes']:g} minutes of its own "
             "time, in interleaved turns of 10 steps. Validation: the same "
             f"{r['validation_sequences']} sequences of `mlm_corpus/valid.txt` with fixed masks.", ""]
    rows = [[row["contender"], f"{row['steps']:,}", f"{row['tokens_per_second']:,.0f}",
             f"**{row['speedup_vs_transformers']:.2f}x**", f"{row['valid_mlm_loss']:.3f}",
             f"{100 * row['valid_accuracy']:.1f}%"] for row in r["rows"]]
    lines += _table(["contender", "steps", "tokens/s", "vs transformers", "valid MLM loss",
                     "masked-token accuracy"], rows)
    curves = {row["contender"]: {int(c[0]): c[2] for c in row["curve"]} for row in r["rows"]}
    if "encoderkit fp32" in curves and "encoderkit bf16" in curves:
        common = sorted(set(curves["encoderkit fp32"]) & set(curves["encoderkit bf16"]))
        gaps = [abs(curves["encoderkit fp32"][s] - curves["encoderkit bf16"][s]) for s in common]
        lines += ["", f"fp32 and bf16 autocast at the same steps (1-{common[-1]}): the training losses differ by "
                      f"{sum(gaps) / len(gaps):.3f} on average (at most {max(gaps):.3f}). The curves agree, so "
                      "`encoderkit pretrain --dtype auto` (the default) uses bf16 where the CPU has native bf16 units."]
    return lines + ["", f"![training loss per wall-clock]({r['plot']})", ""]


def render_pretrain_run(r: dict[str, Any]) -> list[str]:
    return ["## A budgeted pre-training run (`bench/pretrain_run.py`)", "", _machine(r), "",
            f"The benchmark shape (4 layers, hidden 256) trained on `mlm_corpus/train.txt` for {r['minutes']:g} minutes "
            f"({'bf16 autocast' if r['bf16'] else 'fp32'}): {r['steps']:,} steps at {r['tokens_per_second']:,.0f} "
            "tokens/s.", "",
            *_table(["", "masked-token top-1 accuracy on valid.txt", "validation MLM loss"], [
                ["this model", f"**{100 * r['valid_accuracy']:.1f}%**", f"{r['valid_mlm_loss']:.3f}"],
                [f"unigram baseline (always {r['unigram_token']!r})", f"{100 * r['unigram_baseline_accuracy']:.1f}%",
                 ""]]),
            "", f"![loss curve]({r['plot']})", ""]


def render_pretrain_families(r: dict[str, Any]) -> list[str]:
    rows = r["rows"]
    modern = next(row for row in rows if row["model_type"] == "modernbert")
    bert = next(row for row in rows if row["model_type"] == "bert")
    p_modern, p_bert = modern["parameters"], bert["parameters"]
    lines = ["## Pre-training comparison: modernbert-tiny vs a BERT of equal size (`bench/pretrain_families.py`)", "",
             _machine(r), "",
             f"Corpus: `../shared/{r['corpus']}`, which is the WikiText-2 (raw) **test** split, one row per line. "
             f"Its first {r['train_lines']:,} non-empty lines are the training text ({r['training_sequences']:,} "
             f"packed sequences of {r['sequence_length']} tokens). The last {r['valid_lines']:,} lines "
             f"({100 * r['valid_fraction']:.0f}%) are held out as the validation text ({r['validation_sequences']} "
             "sequences). The loss is therefore measured on part of WikiText-2's test split, with neither model "
             "having trained on those lines. It is not a held-out WikiText-2 number and compares with no "
             "published figure.", "",
             f"Both models use the default model's WordPiece vocabulary ({r['vocab_size']:,} tokens) and have the "
             f"same batch ({r['batch_size']}), AdamW settings (lr {r['learning_rate']:g}, {r['warmup_steps']} warm-up "
             f"steps then constant, weight decay {r['weight_decay']:g}, clipping 1.0), data order and precision "
             f"({r['dtype']}). Each trained for {r['budget_minutes']:g} minutes of its own time, in interleaved "
             f"turns of {r['chunk']} steps. Parameters are counted as distinct tensors, tied embeddings once. "
             f"modernbert-tiny has {p_modern['base']:,} without the MLM head and {p_modern['masked_lm']:,} with it. "
             f"The BERT has {p_bert['base']:,} (pooler included) and {p_bert['masked_lm']:,}, a gap of "
             f"{100 * r['parameter_gap']:.2f}% with the heads. Of each count, {p_modern['embedding']:,} are the "
             "token embeddings.", "",
             "Each family trains at its own masking rate, ModernBERT at 30% and BERT at 15%. That rate is part of "
             "each recipe, so the ModernBERT run gets about twice as many prediction targets per step. Both are "
             "scored on the **same validation sequences with the same fixed masks**: at 15% (the comparable "
             "number) and also at 30%. Every evaluation runs in fp32, and its time is not counted in the budget.",
             ""]
    table = []
    for row in rows:
        table.append([row["contender"],
                      row["shape"],
                      f"{row['parameters']['masked_lm']:,}", f"{100 * row['train_mask_rate']:.0f}%",
                      f"{row['steps']:,}", f"{row['tokens_seen']:,} ({row['epochs']:.1f} epochs)",
                      f"{row['tokens_per_second']:,.0f}",
                      f"**{row['valid_loss_15']:.3f}**", f"{100 * row['valid_accuracy_15']:.1f}%",
                      f"{row['valid_loss_30']:.3f}", f"{100 * row['valid_accuracy_30']:.1f}%",
                      f"{row['best_valid_loss_15']:.3f} (step {row['best_at_step']:,}, "
                      f"{row['best_at_seconds'] / 60:.1f} min)"])
    lines += _table(["model", "shape", "parameters (with MLM head)", "trained at", "steps", "tokens seen",
                     "tokens/s", "valid MLM loss, 15% masks", "masked-token accuracy, 15%", "valid MLM loss, 30% masks",
                     "masked-token accuracy, 30%", "lowest valid loss at 15% (when)"], table)
    lower, higher = sorted((modern, bert), key=lambda row: row["valid_loss_15"])
    def trend(row: dict[str, Any]) -> str:  # the last evaluation against the one at three quarters of the budget
        points = row["evaluations"]
        earlier = min(points, key=lambda p: abs(p["seconds"] - 0.75 * points[-1]["seconds"]))
        change = points[-1]["loss_15"] - earlier["loss_15"]
        return (f"{row['contender']} {'fell' if change < 0 else 'rose'} by {abs(change):.3f} over the last quarter "
                "of its time")
    lines += ["", f"At the end of the budget, {lower['contender']} has the lower validation loss on the 15% masks: "
              f"{lower['valid_loss_15']:.3f} against {higher['valid_loss_15']:.3f}, a gap of "
              f"{higher['valid_loss_15'] - lower['valid_loss_15']:.3f} nats. On the 30% masks the losses are "
              f"{modern['valid_loss_30']:.3f} (modernbert-tiny) and {bert['valid_loss_30']:.3f} (BERT). "
              f"In the same time, modernbert-tiny took {modern['steps']:,} steps and the BERT took {bert['steps']:,}. "
              + f"The validation loss (15% masks) of {trend(modern)}, and that of {trend(bert)}. "
              f"Both models saw the training text many times ({modern['epochs']:.0f} and {bert['epochs']:.0f} "
              "epochs). These numbers come from one seed and one short run on a small corpus, with each family's own "
              "dropout (ModernBERT none, BERT 0.1). They show how these two models compare on this machine and "
              "this budget, not which architecture is better in general. No threshold applies.", "",
              f"![validation loss per wall-clock]({r['plot']})", ""]
    return lines


def render_attention_heads(r: dict[str, Any]) -> list[str]:
    s, a = r["statistics"], r["antecedents"]
    lines = ["## Attention heads of all-MiniLM-L6-v2 (`bench/attention_heads.py`)", "", _machine(r), "",
             f"Where each head attends, averaged over the tokens of each of {s['texts']:,} texts of "
             f"`../shared/bench/sentences.txt` ({s['mean_tokens']:.1f} tokens on average, at most {s['max_length']}), "
             "then over texts; layer-head numbered from 0. Entropy of uniform attention: "
             f"{s['uniform_entropy']:.2f} nats.", ""]
    lines += _table(["attention to", "mean over heads", "top heads (layer-head: share)"], [
        [row["category"], f"{row['mean']:.3f}", ", ".join(f"{t['layer']}-{t['head']}: {t['value']:.3f}"
                                                            for t in row["top"])] for row in s["rows"]])
    lines += ["", f"Pronoun -> antecedent on the {a['examples']} hand-written examples of "
              "`tests/data/pronoun_antecedents.jsonl` (" + ", ".join(f"{n} {k}" for k, n in a["kinds"].items())
              + f"), {a['heads']} heads ranked by candidate accuracy (the antecedent gets more attention than the "
              f"distractor). Chance: {100 * a['candidate_chance']:.0f}%; the candidate nearest before the pronoun: "
              f"{100 * a['nearest_candidate_accuracy']:.1f}%; a random word as argmax: "
              f"{100 * a['random_word_chance']:.1f}%.", ""]
    headers = ["head", "candidate accuracy", "winograd", "agreement", "argmax accuracy", "attention (x chance)"]
    lines += _table(headers, [
        [f"{row['layer']}-{row['head']}", f"{100 * row['candidate_accuracy']:.1f}%",
         f"{100 * row['candidate_accuracy_by_kind']['winograd']:.1f}%",
         f"{100 * row['candidate_accuracy_by_kind']['agreement']:.1f}%", f"{100 * row['accuracy']:.1f}%",
         f"{row['mean_attention']:.3f} ({row['attention_lift']:.1f}x)"] for row in a["rows"]])
    best = a["rows"][0]
    lines += ["", f"Head chosen leave-one-out: candidate accuracy {100 * a['leave_one_out_candidate_accuracy']:.1f}%, "
              f"argmax accuracy {100 * a['leave_one_out_argmax_accuracy']:.1f}%. The best of {a['heads']} heads that "
              f"guessed at random would reach the top score with probability {a['p_best_of_coin_flip_heads']:.2f}. "
              f"Head {best['layer']}-{best['head']} attends most to one of the two candidates in "
              f"{100 * a['best_head_picks_a_candidate']:.0f}% of the examples, but is right on both sentences of only "
              f"{a['best_head_winograd_pairs_both_right']} of {a['winograd_pairs']} Winograd pairs.", "",
              "![head statistics](bench/results/attention/head_statistics.png)",
              "![antecedent heads](bench/results/attention/antecedent_heads.png)", ""]
    return lines


def render_refactor_speed(r: dict[str, Any]) -> list[str]:
    flags = ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in r["cpu_flags"].items())
    before, after = r["before"]["revision"], r["after"]["revision"]
    lines = [f"## Embedding speed before and after (`bench/refactor_speed.py`): {before} against {after}, "
             f"{r['machine']['threads']} threads, {r['machine']['cpu']}", "", _machine(r), "",
             f"`Embedder.from_pretrained().encode()` on "
             f"{r.get('text_source', 'the ' + format(r['texts'], ',') + ' texts of `../shared/bench/sentences.txt`')}, "
             f"before (`{before}`) and after (`{after}`), each version in its own worker process, timed in "
             f"{r['repeats']} interleaved ABBA repeats (before, after, after, before). texts/s: median over the "
             "repeats; after/before: the speed ratio of each repeat (> 1: after is faster), median and each. "
             f"CPU flags: {flags}.", ""]
    rows = [[row["dtype"], f"{row['before_texts_per_second']:,.0f}", f"{row['after_texts_per_second']:,.0f}",
             f"**{row['median_ratio']:.3f}x**", " ".join(f"{x:.3f}" for x in row["ratios_after_over_before"]),
             f"{row['max_abs_diff']:.1e}"] for row in r["rows"]]
    header = ["dtype", "before texts/s", "after texts/s", "after/before (median)", "per repeat",
              "max abs diff of the vectors"]
    if r.get("latency_calls"):
        lines[-2] += (f" Single text: `encode` of one short text (bench/peers.py's 5, in turn), {r['latency_calls']} "
                      "calls per version, dtype and repeat, in the same ABBA order; p50 over all of them.")
        header += ["single text p50 ms, before", "after"]
        for row, cells in zip(r["rows"], rows):
            cells += [f"{row['before_single_text_p50_ms']:.2f}", f"{row['after_single_text_p50_ms']:.2f}"]
    if r.get("note"):
        lines[-2] += " " + r["note"]
    lines += _table(header, rows) + [""]
    finetune = r.get("finetune")
    if finetune:
        lines += [f"Fine-tuning (`finetune`, classify, the first {finetune['rows']:,} rows of SST-2, 1 epoch, batch 32, "
                  f"max length 64, random batches), once per version in each ABBA repeat: "
                  f"{finetune['before_step_ms']:.0f} ms a step before, {finetune['after_step_ms']:.0f} after, "
                  f"after/before **{finetune['median_ratio']:.3f}x** (per repeat "
                  f"{' '.join(f'{x:.3f}' for x in finetune['ratios_after_over_before'])}).", ""]
    if r.get("goals"):
        lines += [f"- {goal['goal']}: {goal['measured']}: **{'met' if goal['met'] else 'not met'}**"
                  for goal in r["goals"]] + [""]
    return lines


def render_long_context(r: dict[str, Any]) -> list[str]:
    flags = ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in r["cpu_flags"].items())
    shape = r["shape"]
    lines = ["## Long context: ModernBERT-base shape, 512 to 8,192 tokens (`bench/long_context.py`)", "", _machine(r), "",
             f"CPU flags: {flags}; torch threads: {r['threads']}. A random ModernBERT-base-shaped model "
             f"({shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, {shape['num_attention_heads']} heads, "
             f"GeGLU {shape['intermediate_size']}, global attention every {shape['global_attn_every_n_layers']}rd layer, "
             f"local window {shape['local_attention']}) saved once by transformers and loaded by both; one sequence of "
             "random ids per forward (batch of one, no padding). Each (contender, length) runs in a fresh subprocess, "
             f"{r['order'].split(': ', 1)[1].split(' (')[0]}; per subprocess one untimed warm-up forward, then "
             f"{', '.join(f'{n} at {int(k):,}' for k, n in r['repeats_per_subprocess'].items())} timed forwards; time "
             "per forward: the median over both subprocesses. Peak RSS: `getrusage(RUSAGE_SELF).ru_maxrss` of the "
             "subprocess, its high-water mark reset once the model is loaded and has run one 16-token forward (so "
             "transformers' memory-mapped weights are paged in and encoderkit's pre-packed weight copies exist: both in "
             "\"loaded\"); the increase is that peak minus the RSS of the loaded model. Final states agree to "
             f"{r['max_abs_diff_at_512']:.1e} (max abs diff) at 512 tokens before timing.", ""]
    rows = []
    for row in r["rows"]:
        speed = row.get("speedup_vs_transformers")
        memory = row.get("memory_ratio_vs_transformers")
        rows.append([f"{row['length']:,}", row["label"], f"{row['seconds_per_forward']:.2f}",
                     f"{row['tokens_per_second']:,.0f}", "" if speed is None else f"**{speed:.2f}x**",
                     f"{row['rss_after_load_mib']:,.0f}", f"{row['peak_rss_mib']:,.0f}",
                     f"{row['peak_increase_mib']:,.0f}", "" if memory is None else f"{memory:.2f}",
                     f"{row['max_abs_diff_vs_transformers']:.1e}"])
    lines += _table(["tokens", "contender", "s / forward", "tokens/s", "speed vs transformers", "loaded RSS MiB",
                     "peak RSS MiB", "peak increase MiB", "increase / transformers'", "max abs diff"], rows)
    loaded = {row["contender"]: row["rss_after_load_mib"] for row in r["rows"]}
    if {"encoderkit", "transformers"} <= set(loaded):
        lines += ["", f"encoderkit's loaded RSS is {loaded['encoderkit'] - loaded['transformers']:,.0f} MiB above "
                      "transformers': the engine keeps a oneDNN pre-packed copy of every linear weight beside the "
                      "parameters, which the absolute peaks include and the increases do not."]
    lines += ["", "Goals of issue 19:", ""]
    lines += [f"- {goal['goal']}: {goal['value']}, **{'met' if goal['met'] else 'not met'}**" for goal in r["goals"]]
    return lines + ["", f"![time and peak memory against length]({r['plot']})", ""]


def render_peers(r: dict[str, Any]) -> list[str]:
    versions = ", ".join(f"{name} {version}" for name, version in r["versions"].items())
    kept = r.get("kept_as")  # the tier of a kept earlier run (bench/peers.py's keep_other_tier_run)
    tiers = {"native_bf16": "with native bf16", "avx512": "with AVX-512 and no bf16 units", "avx2": "with AVX2 only",
             "no_native_bf16": "without native bf16", "avx2_imitated": "with AVX2 only, imitated on a bigger CPU"}
    other_model = not r["model"].startswith("all-MiniLM-L6-v2")  # bench/peers.py --model
    imitated = r.get("tier") == "avx2_imitated"  # bench/peers.py's run on a bigger CPU limited to AVX2
    title = "## encoderkit against other CPU runtimes (`bench/peers.py`)" + (
        f", on a CPU {tiers.get(kept, kept)} (an earlier run)" if kept else "") + (
        f", on a CPU {tiers['avx2_imitated']}" if imitated else "") + (
        f": {r['model']}" if other_model else "")
    kept_note = (f"Kept as the newest run on a CPU {tiers.get(kept, kept)}: the run above was made on another tier "
                 "of CPU.")
    method = r.get("method") or ("all in one process, interleaved rounds; every peer in its latency mode only (an "
                                 "earlier harness: peers were not yet run in their throughput modes)")
    imitated_note = (" **Imitated tier**: encoderkit (its kernel, oneDNN, MKL, ATen), sentence-transformers and "
                     "CTranslate2 ran limited to AVX2 by the variables above; ONNX Runtime, fastembed (ONNX Runtime) "
                     "and OpenVINO choose their instructions from the CPU itself and ran with its AVX-512, which "
                     "favours them.") if imitated else ""
    lines = [title, "", *([kept_note, ""] if kept else []), _machine(r) + imitated_note, "",
             f"{r['model']}; {r['texts']:,} texts from `../shared/bench/sentences.txt`; {r['threads_per_runtime']} "
             f"threads set explicitly for every runtime; length-sorted batches of {r['batch_size']}; truncation to "
             f"{r['max_length']} tokens; mean pooling and L2 normalisation. Texts in, vectors out: tokenization is "
             f"timed for every row. {method[0].upper() + method[1:]}; {r['rounds']} rounds, the median; the ratio to "
             f"sentence-transformers is the median of per-round ratios. Versions: {versions}."]
    load = r.get("load_average_1min")
    if load:
        lines[-1] += (f" 1-minute load average of the machine before and after the rounds: {load['before']:.1f} and "
                      f"{load['after']:.1f}.")
    lines.append("")
    rows = []
    for row in r["rows"]:
        ek = row["max_abs_diff_vs_encoderkit_fp32"]
        rows.append([row["contender"], row["kind"], row.get("mode", "latency"), f"{row['texts_per_second']:,.0f}",
                     f"**{row['vs_sentence_transformers']:.2f}x**",
                     f"{row['max_abs_diff_vs_sentence_transformers']:.1e}",
                     "" if ek is None else f"{ek:.1e}", f"{100 * row['sts_dev_spearman']:.2f}", row["notes"]])
    lines += _table(["runtime", "precision", "mode", "texts/s", "vs ST", "max abs diff vs ST fp32",
                     "vs encoderkit fp32", "STS-B dev Spearman x100", "how"], rows)
    if r["not_available"]:
        lines += ["", "Not in this run: " + "; ".join(f"{name} ({why})" for name, why in r["not_available"].items())
                  + "."]
    latency = r["latency"]
    lines += ["", f"Single-text latency (the serving case): one text per call, {latency['calls']} calls per runtime "
                  f"over {len(latency['texts'])} short texts of {min(latency['tokens'])}-{max(latency['tokens'])} "
                  f"tokens, tokenization included; {latency['method']}.", ""]
    # results from before the alone / own-process figures lack them
    extra = [(prefix, label) for prefix, label in (("alone_", "alone"), ("own_process_", "own process"))
             if f"{prefix}p50_ms" in latency["rows"][0]]
    header = ["runtime", "precision", "interleaved p50 ms" if extra else "p50 ms", "p90 ms", "p99 ms"]
    for _, label in extra:
        header += [f"{label} p50 ms", f"{label} p99 ms"]
    lines += _table(header, [[row["contender"], row["kind"], f"{row['p50_ms']:.2f}", f"{row['p90_ms']:.2f}",
                              f"{row['p99_ms']:.2f}"]
                             + [f"{row[prefix + q]:.2f}" for prefix, _ in extra for q in ("p50_ms", "p99_ms")]
                             for row in latency["rows"]])
    lines.append("")
    goals = r.get("goals")
    if goals is not None:  # issue 39's goals, judged by bench/peers.py against each peer's better mode
        lines += [f"- {goal['goal']}: {goal['measured']}: **{'met' if goal['met'] else 'not met'}**" for goal in goals]
    else:
        lines.append("- This run predates the goals' verdicts (bench/peers.py's `verdicts`), and its peers ran in their "
                     "latency modes only: its ratios are not judged.")
    return lines + [""]


def render_peers_profile(r: dict[str, Any]) -> list[str]:
    ek, peer = r["encoderkit"], r["peer"]
    lines = ["## Where the time goes: encoderkit fp32 against " + peer["contender"] + " (`bench/peers.py`)", "",
             _machine(r), "",
             f"One pass over the 2,000 texts in batches of 32. encoderkit in one lane (`lanes=1`: its ops in order "
             f"on one thread with 2 torch threads) under `torch.profiler`: each op that no "
             f"other op called is charged to its kind (by name, else by the scope it ran in); what no op accounts "
             f"for is Python and dispatch. encoderkit took {ek['unprofiled_seconds']:.2f} s unprofiled, "
             f"{ek['profiled_seconds']:.2f} s profiled. {peer['contender']} (the fastest full-precision peer with a "
             f"per-op profiler; fastest overall: {r['fastest_full_precision_peer']}) under its own profiler: "
             f"{peer['profiled_seconds']:.2f} s ({r['peer_unprofiled_seconds']:.2f} s in the timed rounds). "
             "The full listing is `bench/results/peers_profile.txt`.", ""]
    for name, part in (("encoderkit fp32", ek), (peer["contender"], peer)):
        lines += _table([f"{name}: kind", "seconds", "share"],
                        [[kind, f"{seconds:.3f}", f"{100 * seconds / part['profiled_seconds']:.1f}%"]
                         for kind, seconds in part["seconds_by_kind"].items() if seconds >= 0.0005]) + [""]
    return lines


def _cpu_of(made: dict[str, Any]) -> str:
    """A provenance's CPU and the flags that tell its tier apart (several tiers share one CPU name)."""
    flags = made.get("cpu_flags") or []
    return f"{made.get('cpu', 'unknown CPU')} ({', '.join(flags) if flags else 'flags not recorded'})"


def render_finetune_small(r: dict[str, Any]) -> list[str]:
    """bench/finetune_small.py: per budget, every seed's metric, the means and the paired difference's interval."""
    task = {"sst2": "SST-2 accuracy", "conll": "CoNLL-2003 entity F1"}[r["task"]]
    h = r["hyperparameters"]
    where = f" on a GPU ({r['gpu']}, fp32, TF32 off)" if r.get("gpu") else ""
    lines = [f"## Fine-tuning at small budgets: {task}{where} (`bench/finetune_small.py`)", "", _machine(r), "",
             f"all-MiniLM-L6-v2, 1 epoch, lr {h['learning_rate']}, batch {h['batch_size']}, max length "
             f"{h['max_length']}, {h['warmup_ratio']:.0%} warm-up, weight decay {h['weight_decay']}; seeds "
             f"{', '.join(map(str, r['seeds']))}, each seeding both sides; the same rows and held-out set for both "
             "(see the script's doc). Paired difference: encoderkit minus the Trainer, seed by seed, with its 95% "
             "interval (Student's t).", ""]
    if r.get("note"):
        lines += [r["note"], ""]
    for section in r["sections"]:
        lines += [f"**{section['budget']:,} training rows**", ""]
        own = section.get("provenance")
        extensions = section.get("extensions", [])  # seeds added later (``--extend``)
        seeds = section.get("seeds", r["seeds"])
        first_seeds = seeds[:len(seeds) - sum(len(extension["seeds"]) for extension in extensions)]
        if own and (own.get("commit") != r["provenance"].get("commit") or extensions):
            lines += [f"_This budget was measured apart: {own['date']}, commit {str(own['commit'])[:10]}"
                      f"{' (dirty)' if own.get('dirty') is True else ''}, {_cpu_of(own)}, seeds "
                      f"{', '.join(map(str, first_seeds))}._", ""]
        for extension in extensions:
            made = extension["provenance"]
            what = []
            if extension["seeds"]:
                what.append(f"Seeds {', '.join(map(str, extension['seeds']))} were added later")
            if extension.get("contenders"):  # contenders new to the section, at every seed
                added = extension["contenders"]
                what.append(f"{', '.join(added)} {'was' if len(added) == 1 else 'were'} added later, at every seed")
            lines += [f"_{'; '.join(what)}: {made['date']}, commit "
                      f"{str(made['commit'])[:10]}{' (dirty)' if made.get('dirty') is True else ''}, "
                      f"{_cpu_of(made)}._", ""]
        table = []
        for row in section["rows"]:
            difference = row.get("paired_difference")
            table.append([row["contender"], " / ".join(f"{m:.2f}" for m in row["metrics"]), f"**{row['mean']:.2f}**",
                          "" if difference is None else
                          f"{difference['mean']:+.2f} [{difference['low']:+.2f}, {difference['high']:+.2f}]",
                          f"{row['seconds']:.0f}"])
        lines += _table(["contender", "per seed", "mean", "paired difference [95%]", "train s"], table) + [""]
        lines += [f"- {c['contenders'][0]} minus {c['contenders'][1]}, seed by seed: {c['mean']:+.2f} "
                  f"[{c['low']:+.2f}, {c['high']:+.2f}]" for c in section.get("comparisons", [])]
        lines += [f"- {goal['goal']}: {goal['measured']}: **{'met' if goal['met'] else 'not met'}**"
                  for goal in section["goals"]] + [""]
    return lines


RENDERERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "finetune_small": render_finetune_small,
    "encode": render_encode, "search": render_search, "pretrain": render_pretrain,
    "pretrain_run": render_pretrain_run, "pretrain_families": render_pretrain_families,
    "attention_heads": render_attention_heads, "refactor_speed": render_refactor_speed,
    "long_context": render_long_context, "peers": render_peers, "peers_profile": render_peers_profile}


@functools.cache  # a script's module is loaded once, however many results it wrote
def _script_renderer(name: str) -> Callable[[dict[str, Any]], list[str]] | None:
    """A benchmark script may render its own section: a ``render(result) -> list[str]`` in bench/<name>.py."""
    import importlib.util
    import sys

    script = ROOT / "bench" / f"{name}.py"
    if not script.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"bench_{name}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return getattr(module, "render", None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md", help="where to write (default: %(default)s)")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="leave out, with a warning, a result without provenance or verdicts, rather than refuse")
    args = parser.parse_args(argv)
    results, refused = _results()
    for name, problems in refused.items():
        print(f"{'leaving out' if args.skip_invalid else 'refusing'} {RESULTS / name}: {'; '.join(problems)}",
              file=sys.stderr)
    if refused and not args.skip_invalid:
        print(f"wrote nothing: {len(refused)} result(s) cannot be reported (--skip-invalid leaves them out)",
              file=sys.stderr)
        return 1
    lines = ["# Benchmarks", "", "Generated by `python -m bench report` (bench/report.py) from `bench/results/*.json`; "
             "do not edit by hand. Sections are grouped by kind; each names the script that produced it, and the "
             "commit, CPU and date it was measured at.", ""]
    headings: set[str] = set()
    for kind, title in KINDS.items():
        group = [(path, result) for path, result in results if BY_RESULT[result["benchmark"]].kind == kind]
        if group:
            lines += [f"## {title}", ""]
        for path, result in group:
            lines += _named_apart(_section(path.name, result), path.name, headings)
    args.out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


def _results() -> tuple[list[tuple[Path, dict[str, Any]]], dict[str, list[str]]]:
    """The reportable results, in file-name order, and the problems of those that are not (registry.py says)."""
    results, refused = [], {}
    for path in sorted(RESULTS.glob("*.json")):
        result, problems = load_result(path)
        if problems:
            refused[path.name] = problems
        else:
            results.append((path, result))
    return results, refused


def _section(name: str, result: dict[str, Any]) -> list[str]:
    """One result's section, its headings one level below its kind's, with the line of where and when."""
    renderer = RENDERERS.get(result["benchmark"]) or _script_renderer(result["benchmark"])
    if renderer is None:
        section = [f"## {result['benchmark']}", "", "```json", json.dumps(result, indent=2), "```", ""]
    else:
        try:
            section = renderer(result)
        except Exception:
            print(f"rendering {name} failed:", file=sys.stderr)
            raise
        if not any(line.startswith("_") and "Command:" in line for line in section):
            section[1:1] = ["", _machine(result)]  # every section says where and when it was measured
    section = ["#" + line if HEADING.match(line) else line for line in section]
    return section + ([""] if section and section[-1] else [])


HEADING = re.compile(r"^#+ ")


def _named_apart(section: list[str], name: str, headings: set[str]) -> list[str]:
    """``section`` with its first heading followed by the result file's name where an earlier section has the same
    heading (two runs of one script, kept apart), so that a reader can tell them apart; ``headings`` collects."""
    first = next((i for i, line in enumerate(section) if HEADING.match(line)), None)
    if first is not None:
        if section[first] in headings:
            section = [*section[:first], f"{section[first]}: `{name}`", *section[first + 1:]]
        headings.add(section[first])
    return section


if __name__ == "__main__":
    sys.exit(main())
