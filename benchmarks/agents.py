"""quickstart_tools: held-out accuracy of a tiny model adding two 3-digit numbers, with the ``calc``
tool and without it, side by side (the issue's target: near 0 -> >= 0.8 within 5 minutes on 2
cores with the tool; low without).

Runs the ``quickstart_tools`` recipe twice, ``rollout.environment.with_tool=true`` and ``=false``,
one after the other (run it under the shared lock: ``flock /tmp/rlzoo-heavy.lock python
benchmarks/agents.py``), validating every 10 steps, and prints both validation curves with the
elapsed training time, then the agent metrics of the last step.

``--async``: instead, runs the recipe (with the tool) under ``sync``, under ``fully_async``
(partial rollouts, a weight push every step, staleness <= 1 version, the same 32 prompts x n
responses per step), and under ``fully_async`` with truncated importance sampling
(``algorithm.rollout_correction.name=token_is``), and prints the training reward per sample
consumed side by side (means over windows of 10 steps): the issue's target is fully_async within
0.1 of sync at an equal number of samples.

    python benchmarks/agents.py [--steps N] [--async [--fa OVERRIDE ...]] [extra overrides ...]

``--fa``: an override for the fully_async run only (e.g. an off-policy correction).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import rlzoo
from rlzoo.report.metrics import read_metrics

#: fully_async with the sync step's prompts: require_batches x ppo_mini_batch_size (16) = 32
FULLY_ASYNC = (
    "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
    "require_batches:2,partial_rollout:true}"
)


def run(
    tmp: str, with_tool: bool, steps: int, overrides: list[str], name: str | None = None
) -> list[dict[str, Any]]:
    name = name or ("tool" if with_tool else "no_tool")
    r = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={tmp}/data",
            f"run.output_dir={tmp}/{name}",
            "run.progress=false",
            "trainer.test_freq=10",
            f"trainer.total_steps={steps}",
            f"rollout.environment.with_tool={str(with_tool).lower()}",
            *overrides,
        ],
    )
    r.train()
    assert r.run_dir is not None
    recs = read_metrics(r.run_dir)
    for rec in recs:  # samples trained per step: prompts x responses per prompt
        rec["bench/samples"] = r.config.data.train_batch_size * r.config.rollout.n
    return recs


def curve(recs: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """step -> (validation accuracy, training seconds so far)."""
    train = [r for r in recs if r["step"] > 0]
    t0 = train[0]["time"] - train[0]["timing_s/step"] if train else 0.0
    out = {}
    for r in recs:
        if "val/mean" in r:
            out[int(r["step"])] = (float(r["val/mean"]), 0.0 if r["step"] == 0 else r["time"] - t0)
    return out


#: the issue's target for the held-out accuracy with the tool
TARGET = 0.8

#: the off-policy correction the fully_async column runs with (truncated importance sampling)
TIS = "algorithm.rollout_correction.name=token_is"


def compare_runners(steps: int, overrides: list[str], fa_overrides: list[str]) -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        runs = {
            "sync": run(tmp, True, steps, overrides, "sync"),
            "fully_async": run(tmp, True, steps, [*overrides, FULLY_ASYNC, *fa_overrides], "fully_async"),
            "fully_async+tis": run(tmp, True, steps, [*overrides, FULLY_ASYNC, TIS, *fa_overrides], "fa_tis"),
        }
        wall = time.time() - t0
    print(f"load average at start: {load:.2f}; wall {wall:.0f} s for the three runs")
    print("training reward per sample, means over 10 steps (diff: fully_async+tis - sync)")
    print(f"{'steps':>9} {'samples':>8} | " + " | ".join(f"{k:>15}" for k in runs) + f" | {'diff':>6}")
    trained = {k: [r for r in v if r["step"] > 0] for k, v in runs.items()}
    a = trained["sync"]
    for lo in range(0, min(len(v) for v in trained.values()), 10):
        means = [
            sum(r["critic/score/mean"] for r in v[lo : lo + 10]) / len(v[lo : lo + 10])
            for v in trained.values()
        ]
        hi = lo + len(a[lo : lo + 10])
        samples = sum(r["bench/samples"] for r in a[:hi])
        cells = " | ".join(f"{m:>15.3f}" for m in means)
        print(f"{lo + 1:>4}-{hi:<4} {samples:>8.0f} | {cells} | {means[2] - means[0]:>+6.3f}")
    for k in ("fully_async", "fully_async+tis"):
        b = trained[k]
        worst = {
            key: max((r.get(key, float("nan")) for r in b), default=float("nan"))
            for key in ("rollout_corr/kl", "actor/grad_norm", "staleness/max")
        }
        print(f"{k}: max over steps " + ", ".join(f"{key}={v:.3g}" for key, v in worst.items()))
    # fully_async's steps take the same prompts as sync's (require_batches x mini-batch)
    consumed = [r.get("trainer/prompts_consumed") for r in trained["fully_async"][:2]]
    print(
        f"fully_async prompts consumed after steps 1, 2: {consumed} (sync: {a[0]['bench/samples']} samples/step)"
    )


def reinforce(
    model: Any, tok: Any, case: Any, steps: int, estimator: Any, every: int = 10, seed: int = 0
) -> dict[int, tuple[float, float]]:
    """One bandit: each step 32 prompts from ``case(rng)`` (-> context messages, wanted words) x 8
    samples of up to len(wanted) + 1 tokens, each token scored in place against the wanted words and
    the stop token (1 or 0; nothing after a stop token); the advantage from ``estimator``; one AdamW
    step (lr 3e-3, entropy bonus 0.03, grad clip 1). Returns step -> (share of the wanted words
    repeated in place, sampled; share of prompts answered exactly, greedy)."""
    import random

    import torch

    from rlzoo.kernel.protocols import AdvantageInputs

    rng = random.Random(seed)
    eos = int(tok.eos_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out: dict[int, tuple[float, float]] = {}
    for step in range(steps + 1):
        prompts, targets = [], []
        for _ in range(32):
            messages, words = case(rng)
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompts.append(tok(text, add_special_tokens=False)["input_ids"])
            targets.append([*tok.convert_tokens_to_ids(words), eos])
        if len({len(p) for p in prompts}) > 1 or len({len(t) for t in targets}) > 1:
            raise ValueError("a bandit case must give contexts and answers of one length")
        prompt = torch.tensor(prompts).repeat_interleave(8, 0)  # [B, P]
        want = torch.tensor(targets).repeat_interleave(8, 0)  # [B, L]
        P, L = prompt.shape[1], want.shape[1]
        with torch.no_grad():
            sampled = model.generate(prompt, max_new_tokens=L, do_sample=True, top_k=0, pad_token_id=eos)
        resp = torch.nn.functional.pad(sampled[:, P:], (0, L), value=eos)[:, :L]  # [B, L]
        seen = (resp == eos).long().cumsum(-1)  # [B, L]
        mask = ((seen == 0) | ((seen == 1) & (resp == eos))).float()  # up to the stop token
        hit = (resp == want).float() * mask  # [B, L]
        if step % every == 0:
            with torch.no_grad():
                greedy = model.generate(prompt[::8], max_new_tokens=L, do_sample=False, pad_token_id=eos)
            g = torch.nn.functional.pad(greedy[:, P:], (0, L), value=eos)[:, :L]
            out[step] = (
                hit[:, :-1].sum().item() / (32 * 8 * (L - 1)),
                (g == want[::8]).all(-1).float().mean().item(),
            )
        groups = torch.arange(32).repeat_interleave(8)
        adv = estimator(AdvantageInputs(hit, mask, groups, turn_ids=torch.where(mask > 0, 0, -1))).advantages
        logits = model(torch.cat([prompt, resp], 1)).logits[:, P - 1 : -1]  # [B, L, V]
        logp = torch.log_softmax(logits, -1)
        lp = logp.gather(-1, resp.unsqueeze(-1)).squeeze(-1)  # [B, L]
        ent = -(logp.exp() * logp).sum(-1)  # [B, L]
        loss = -((adv * lp + 0.03 * ent) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return out


def tiny_task_model(tmp: str, seed: int = 0) -> tuple[Any, Any]:
    """The recipe's tiny model (as the ``tool_arithmetic`` dataset builds it) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    import rlzoo.tasks.tools as task
    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.tasks._tools import prepare

    torch.manual_seed(seed)
    prepare(Path(tmp), task.ToolArithmeticDataParams(train_size=8, val_size=8, seed=seed))
    model = AutoModelForCausalLM.from_pretrained(f"{tmp}/model", dtype=torch.float32)
    return model, load_tokenizer(f"{tmp}/model")


def _token_credit(x: Any) -> Any:
    """The ``token_grpo`` part with gamma 0: each token its own credit."""
    from rlzoo.algorithms.advantage import TokenGRPOParams
    from rlzoo.algorithms.functional.advantage import token_grpo

    return token_grpo(x, TokenGRPOParams(gamma=0.0))


def _print_curves(title: str, curves: dict[str, dict[int, tuple[float, float]]], rows: int = 4) -> None:
    """The bandits' curves side by side, ``rows`` to a table: (repeated share, exact share) per step."""
    print(title)
    names = list(curves)
    for at in range(0, len(names), rows):
        group = names[at : at + rows]
        print(f"{'step':>5} | " + " | ".join(f"{k:>22}" for k in group))
        for step in sorted(curves[group[0]]):
            cells = (f"{curves[k][step][0]:>11.3f} {curves[k][step][1]:>10.3f}" for k in group)
            print(f"{step:>5} | " + " | ".join(cells))


def compare_credit(steps: int, seed: int = 0) -> None:
    """The call alone, as a bandit (:func:`reinforce`): the recipe's tiny model sees ``<|user|> a +
    b <|assistant|>`` and is scored in place against ``calc a + b <eos>``, the advantage from the
    ``grpo`` part (the rewards summed: one credit per sequence) or the ``token_grpo`` part (gamma 0:
    each token its own credit)."""
    import torch

    from rlzoo.algorithms.advantage import GRPOParams
    from rlzoo.algorithms.functional.advantage import grpo

    torch.set_num_threads(1)
    estimators = {"grpo": lambda x: grpo(x, GRPOParams()), "token_grpo": _token_credit}
    curves = {}
    for name, estimator in estimators.items():
        with tempfile.TemporaryDirectory() as tmp:
            model, tok = tiny_task_model(tmp, seed)
            curves[name] = reinforce(model, tok, _case_call, steps, estimator, seed=seed)
    _print_curves(
        "the call alone: share of the question's words repeated in place (sampled) | exact calls (greedy)",
        curves,
    )


def _question(rng: Any, sum_digits: int = 4) -> tuple[int, int, str]:
    while True:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if len(str(a + b)) == sum_digits:
            return a, b, f"{' '.join(str(a))} + {' '.join(str(b))}"


def _after_call(q: str, reply: str, shown: str | None = None) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": shown or q},
        {"role": "assistant", "content": f"calc {q}"},
        {"role": "tool", "content": reply},
    ]


def _blanks(q: str) -> str:
    return f"{q} = ? ? ? ?"  # the recipe's question (blanks: true; 4-digit sums)


def _case_call(rng: Any, blanks: bool = False) -> tuple[list[dict[str, str]], list[str]]:
    _, _, q = _question(rng)
    return [{"role": "user", "content": _blanks(q) if blanks else q}], ["calc", *q.split()]


def _case_sum(rng: Any) -> tuple[list[dict[str, str]], list[str]]:
    a, b, q = _question(rng)
    s = " ".join(str(a + b))
    return _after_call(q, s), s.split()


def _case_echo(rng: Any, blanks: bool = False) -> tuple[list[dict[str, str]], list[str]]:
    a, b, q = _question(rng)
    line = f"{q} = {' '.join(str(a + b))}"
    if blanks:  # the recipe: "Answer:" and calc's line, as the call is "calc" and the question
        return _after_call(q, line, _blanks(q)), ["Answer:", *line.split()]
    return _after_call(q, line), line.split()


def _random_reply(lo: int, hi: int) -> Any:
    def case(rng: Any) -> tuple[list[dict[str, str]], list[str]]:
        _, _, q = _question(rng)
        r = " ".join(str(rng.randint(lo, hi)))
        return _after_call(q, r), r.split()

    return case


#: what the answer turn repeats of calc's reply, with the question, the call and the reply in
#: context (4-digit sums); "after the call": from the model that first learned the call
COPY_CASES: dict[str, Any] = {
    "sum": _case_sum,
    "random 1000-9999": _random_reply(1000, 9999),
    "random 1000-1999": _random_reply(1000, 1999),
    "echo": _case_echo,
}


def compare_copies(steps: int, seed: int = 0) -> None:
    """What the answer turn learns to repeat (:func:`reinforce`, ``token_grpo`` credit), each from
    the recipe's untrained tiny model: calc's reply as it is (a 4-digit sum: always starts with 1),
    a random 4-digit number (first digit 1-9), a random one that starts with 1, and the echoed line
    ``a + b = s``; then, from the model that first learned the call for ``steps``, the echo as the
    answer (the question ``a + b``), and the recipe's pair: the question ``a + b = ? ? ? ?`` and the
    answer ``Answer: a + b = s`` (the call and the answer repeat the line before them at one distance)."""
    import functools

    import torch

    torch.set_num_threads(1)
    curves = {}
    for name, case in COPY_CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            model, tok = tiny_task_model(tmp, seed)
            curves[name] = reinforce(model, tok, case, steps, _token_credit, seed=seed)
    for blanks, label in ((False, "echo after the call"), (True, "recipe, after the call")):
        with tempfile.TemporaryDirectory() as tmp:
            model, tok = tiny_task_model(tmp, seed)
            call = functools.partial(_case_call, blanks=blanks)
            curves[f"call{' (blanks)' if blanks else ''}"] = reinforce(
                model, tok, call, steps, _token_credit, seed=seed
            )
            echo = functools.partial(_case_echo, blanks=blanks)
            curves[label] = reinforce(model, tok, echo, steps, _token_credit, seed=seed)
    _print_curves(
        "share of the wanted words repeated in place (sampled) / exact answers (greedy), per step", curves
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--async", dest="compare_async", action="store_true", help="sync vs fully_async")
    ap.add_argument(
        "--credit", action="store_true", help="the call alone as a bandit: grpo vs token_grpo credit"
    )
    ap.add_argument(
        "--fa", action="append", default=[], help="an override for the fully_async run only (repeatable)"
    )
    ap.add_argument(
        "--copy", action="store_true", help="what the answer turn learns to repeat, as bandits side by side"
    )
    args, overrides = ap.parse_known_args()
    if args.copy:
        compare_copies(args.steps)
        return
    if args.credit:
        compare_credit(args.steps)
        return
    if args.compare_async:
        compare_runners(args.steps, overrides, args.fa)
        return
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        tool = run(tmp, True, args.steps, overrides)
        no_tool = run(tmp, False, args.steps, overrides)
        wall = time.time() - t0
    a, b = curve(tool), curve(no_tool)
    print(f"load average at start: {load:.2f}; wall {wall:.0f} s for both runs")
    print(f"{'step':>5} | {'val acc (calc)':>14} {'train s':>8} | {'val acc (no tool)':>17} {'train s':>8}")
    for step in sorted(set(a) | set(b)):
        va, ta = a.get(step, (float("nan"), float("nan")))
        vb, tb = b.get(step, (float("nan"), float("nan")))
        print(f"{step:>5} | {va:>14.3f} {ta:>8.1f} | {vb:>17.3f} {tb:>8.1f}")
    sps = {
        label: sum(r["timing_s/step"] for r in recs if r["step"] > 0)
        / max(1, sum(r["step"] > 0 for r in recs))
        for label, recs in (("calc", tool), ("no tool", no_tool))
    }
    print(
        f"seconds per training step: calc {sps['calc']:.2f}, no tool {sps['no tool']:.2f}; "
        f"load average at the end: {os.getloadavg()[0]:.2f}"
    )
    for label, c in (("calc", a), ("no tool", b)):
        hit = [(step, t) for step, (v, t) in sorted(c.items()) if v >= TARGET]
        print(
            f"{label:>8}: held-out >= {TARGET} first at step {hit[0][0]}, {hit[0][1]:.0f} s of training"
            if hit
            else f"{label:>8}: held-out never >= {TARGET} (best {max(v for v, _ in c.values()):.3f})"
        )
    for label, recs in (("calc", tool), ("no tool", no_tool)):
        last = [r for r in recs if r["step"] > 0][-1]
        keys = (
            "critic/score/mean",
            "agent/env/acc",
            "agent/env/call_match",
            "agent/env/answer_match",
            "agent/turns/mean",
            "agent/tool_calls/mean",
            "agent/tool_errors/mean",
            "agent/truncated_frac",
            "agent/model_tokens/mean",
            "agent/env_tokens/mean",
        )
        print(f"{label:>8} last step: " + ", ".join(f"{k}={last.get(k, float('nan')):.3g}" for k in keys))


if __name__ == "__main__":
    main()
